"""What a flytekit ``CreateTask`` brings the connector besides the node's configuration: its input literals.

They come from whoever registered the workflow, so each is checked against
the type the template's interface declares for it; anything unreadable
raises :class:`InvalidInputError` naming the field (``inputs.<name>``), never
a flytekit traceback. The configuration (the template's ``custom``) is
checked by :func:`..connector_core.node_config`, for both connectors.
"""
from typing import Any, Dict, Optional

from flytekit import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.models.literals import LiteralMap
from flytekit.models.task import TaskTemplate

from ..errors import InvalidInputError


def node_inputs(template: TaskTemplate, inputs: Optional[LiteralMap]) -> Dict[str, Any]:
    """The Python values of ``inputs``, each converted to the type the template declares for it."""
    if inputs is None or not inputs.literals:
        return {}
    declared = template.interface.inputs if template.interface is not None else {}
    ctx = FlyteContextManager.current_context()
    values = {}
    for name, literal in inputs.literals.items():
        if name not in declared:
            raise InvalidInputError(f"inputs.{name}", "<literal>", f"one of the node's inputs: {', '.join(declared) or 'none'}")
        python_type: Any = None
        try:
            python_type = TypeEngine.guess_python_type(declared[name].type)
            values[name] = TypeEngine.to_python_value(ctx, literal, python_type)
        except Exception as error:  # flytekit raises many types for a literal of the wrong kind
            raise InvalidInputError(
                f"inputs.{name}", _short(literal), f"a value of type {_type_name(python_type)}, as the node's interface declares",
                reason=f"not convertible ({type(error).__name__})",
            ) from None
    return values


def _type_name(python_type: Any) -> str:
    if python_type is None:
        return "readable"
    return getattr(python_type, "__name__", None) or str(python_type).replace("typing.", "")


def _short(literal: Any) -> str:
    """The literal's value in one short line: its primitive value where it has one."""
    scalar = getattr(literal, "scalar", None)
    primitive = getattr(scalar, "primitive", None) if scalar is not None else None
    value = getattr(primitive, "value", None) if primitive is not None else None
    text = " ".join(str(value if value is not None else "<literal>").split())
    return text if len(text) <= 80 else text[:77] + "..."
