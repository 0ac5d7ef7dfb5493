"""What every scaling node's configuration is: checked when made, carried in the template's ``custom``.

Each node type's configuration (in its own module: :mod:`.scale`,
:mod:`.wait`, :mod:`.restart`, :mod:`.restore`) is a frozen dataclass of
:class:`NodeConfig`. The same dictionaries travel in the task template's
``custom`` field, so a container run and the Flyte connector rebuild exactly
the configuration that was serialized.
"""
from dataclasses import MISSING, asdict, dataclass, fields
from functools import partial
from typing import Any, ClassVar, Dict, Mapping, Optional, Type, TypeVar

from ...errors import InvalidInputError
from ..._core.fieldchecks import Check, CheckedFields
from ..._core.validation import MAX_NODE_TIMEOUT, validate_timeout
from ..readiness import FrameworkOptions

C = TypeVar("C")


@dataclass(frozen=True)
class NodeConfig(CheckedFields):
    """A node's configuration: the cluster it acts on first, its fields checked when made
    (:class:`CheckedFields`), a round trip through the task template's ``custom`` dictionary, and a
    timeout of at most :data:`MAX_NODE_TIMEOUT` (what a connector may be asked to keep polling)."""

    cluster: str
    """``kind/name``, ``namespace/kind/name``, or a bare kind for the run's own cluster."""

    checks: ClassVar[Mapping[str, Check]] = {"timeout": partial(validate_timeout, maximum=MAX_NODE_TIMEOUT)}

    def to_custom(self) -> Dict[str, Any]:
        """The configuration as a JSON-compatible dictionary."""
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_custom(cls: Type[C], custom: Dict[str, Any]) -> C:
        """The configuration from :meth:`to_custom` output; unknown keys are ignored.

        A template's ``custom`` is a protobuf Struct, which stores every
        number as a double, so whole numbers come back to int fields as ints.
        Raises :class:`InvalidInputError` for a ``custom`` that is not a
        dictionary or lacks a required field (each field's own check names it).
        """
        if not isinstance(custom, dict):
            raise InvalidInputError("custom", type(custom).__name__, "a dictionary of the node's configuration")
        types = {f.name: f.type for f in fields(cls)}  # type: ignore[arg-type]
        for f in fields(cls):  # type: ignore[arg-type]
            if f.default is MISSING and f.name not in custom:
                raise InvalidInputError(f"custom.{f.name}", None, f"the {f.name} the node was defined with (required)")
        values = {}
        for key, value in custom.items():
            if key not in types:
                continue
            if types[key] is int and isinstance(value, float) and value.is_integer():
                value = int(value)
            values[key] = value
        return cls(**values)


class ChecksFramework:
    """A node that checks framework readiness (``framework_ready``, ``framework_url`` fields)."""

    framework_ready: bool
    framework_url: Optional[str]

    def framework(self) -> FrameworkOptions:
        """The framework readiness options of this node."""
        return FrameworkOptions(self.framework_ready, self.framework_url)
