"""What a ``CreateTask`` brings the Flyte connector: the node's configuration and its input values.

Both come from whoever registered the workflow, so both are checked as
input: a template's ``custom`` through the node's configuration class (each
field's own check names it), each input literal against the type the
template's interface declares for it. Anything unreadable raises
:class:`InvalidInputError` naming the field (``custom.<name>``,
``inputs.<name>``), never a flytekit traceback.
"""
from typing import Any, Dict, Optional, Type, TypeVar

from flytekit import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.models.literals import LiteralMap
from flytekit.models.task import TaskTemplate

from .errors import InvalidInputError, ScalingError

C = TypeVar("C")


def node_config(config_type: Type[C], template: TaskTemplate) -> C:
    """The node's configuration from the template's ``custom``."""
    try:
        return config_type.from_custom(template.custom)  # type: ignore[attr-defined]
    except ScalingError:
        raise
    except (TypeError, ValueError, AttributeError) as error:
        # A field the configuration class does not check itself (e.g. an unhashable value).
        raise InvalidInputError("custom", type(error).__name__, "the configuration the node was serialized with") from None


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
