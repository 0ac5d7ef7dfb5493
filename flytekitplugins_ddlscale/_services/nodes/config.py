"""Configuration of the scaling nodes: fixed when a task is defined, carried in ``custom``.

The same dictionaries travel in the task template's ``custom`` field, so a
container run and the Flyte connector rebuild exactly the configuration
that was serialized.
"""
from dataclasses import MISSING, asdict, dataclass, fields
from functools import partial
from typing import Any, Callable, Dict, Optional, Tuple, Type, TypeVar

from ...backends._base import DEFAULT_RESTART_TIMEOUT, DEFAULT_SCALE_TIMEOUT
from ...errors import InvalidInputError
from ..readiness import FrameworkOptions
from ...refs import cluster_text
from ..._core.validation import (
    MAX_NODE_TIMEOUT,
    MAX_REPLICAS,
    validate_backend_name,
    validate_bool,
    validate_replicas,
    validate_tier_name,
    validate_timeout,
    validate_url,
)

C = TypeVar("C")


class _Custom:
    """Round trip through the task template's ``custom`` dictionary."""

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


FIELD_CHECKS: Dict[str, Callable[[Any], Any]] = {
    "cluster": cluster_text,
    "worker_hw_tier": validate_tier_name,
    "head_hw_tier": lambda value: validate_tier_name(value, "head_hw_tier"),
    "timeout": lambda value: validate_timeout(value, maximum=MAX_NODE_TIMEOUT),
    "wait": partial(validate_bool, field="wait"),
    "strict": partial(validate_bool, field="strict"),
    "backend": validate_backend_name,
    "framework_ready": partial(validate_bool, field="framework_ready"),
    "framework_url": validate_url,
}
"""Each configuration field's one check (it names the field and the allowed values) and the value it
keeps; ``replicas`` means something else in each node type, so each checks its own."""


class _Checked:
    """A configuration whose fields are checked, and normalised, by :data:`FIELD_CHECKS` when made."""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            check = FIELD_CHECKS.get(f.name)
            if check is not None:
                object.__setattr__(self, f.name, check(getattr(self, f.name)))
        self._check_replicas()

    def _check_replicas(self) -> None:
        """The node type's own check of its ``replicas`` (none by default)."""


class _ChecksFramework:
    """A node that checks framework readiness (``framework_ready``, ``framework_url`` fields)."""

    framework_ready: bool
    framework_url: Optional[str]

    def framework(self) -> FrameworkOptions:
        """The framework readiness options of this node."""
        return FrameworkOptions(self.framework_ready, self.framework_url)


@dataclass(frozen=True)
class ScaleConfig(_Custom, _Checked, _ChecksFramework):
    """Defaults and behaviour of a ``ScaleCluster`` task."""

    cluster: str
    replicas: int
    worker_hw_tier: Optional[str] = None
    head_hw_tier: Optional[str] = None
    wait: bool = True
    timeout: float = DEFAULT_SCALE_TIMEOUT
    strict: bool = False
    backend: Optional[str] = None
    framework_ready: bool = True
    """Also wait until the workers registered with Dask/Ray/Spark where the head can be reached."""
    framework_url: Optional[str] = None
    """The head's dashboard / web UI URL; None: from the environment (docs/readiness.md)."""

    def _check_replicas(self) -> None:
        validate_replicas(self.replicas)


@dataclass(frozen=True)
class RestartConfig(_Custom, _Checked):
    """Defaults and behaviour of a ``RestartHead`` task."""

    cluster: str
    head_hw_tier: Optional[str] = None
    wait: bool = True
    timeout: float = DEFAULT_RESTART_TIMEOUT
    backend: Optional[str] = None


ANY_DESIRED = -1
"""``WaitForCluster`` replicas value meaning "whatever ``spec.worker.replicas`` asks for"."""


@dataclass(frozen=True)
class WaitConfig(_Custom, _Checked, _ChecksFramework):
    """Defaults and behaviour of a ``WaitForCluster`` task."""

    cluster: str
    replicas: int = ANY_DESIRED
    timeout: float = DEFAULT_SCALE_TIMEOUT
    backend: Optional[str] = None
    framework_ready: bool = True
    """As for :class:`ScaleConfig`."""
    framework_url: Optional[str] = None

    def _check_replicas(self) -> None:
        validate_wait_replicas(self.replicas)


FROM_BASELINE = -1
"""``RestoreCluster`` replicas value meaning "the recorded baseline"."""


@dataclass(frozen=True)
class RestoreConfig(_Custom, _Checked, _ChecksFramework):
    """Defaults and behaviour of a ``RestoreCluster`` task."""

    cluster: str
    replicas: int = FROM_BASELINE
    worker_hw_tier: Optional[str] = None
    wait: bool = True
    timeout: float = DEFAULT_SCALE_TIMEOUT
    backend: Optional[str] = None
    framework_ready: bool = True
    """With ``wait``, also wait until the framework dropped the removed workers where the head can be reached."""
    framework_url: Optional[str] = None
    """As for :class:`ScaleConfig`."""

    def _check_replicas(self) -> None:
        validate_restore_target(self.replicas, self.worker_hw_tier)


def validate_restore_target(replicas: object, worker_hw_tier: object) -> Tuple[int, Optional[str]]:
    """A restore target: ``FROM_BASELINE`` (-1) or a worker count, and a tier only with a count."""
    if replicas == FROM_BASELINE and not isinstance(replicas, bool):
        count = FROM_BASELINE
    else:
        try:
            count = validate_replicas(replicas)
        except InvalidInputError:
            raise InvalidInputError(
                "replicas", replicas, f"-1 (the recorded baseline) or an integer from 0 to {MAX_REPLICAS}"
            ) from None
    tier = validate_tier_name(worker_hw_tier)
    if tier is not None and count == FROM_BASELINE:
        raise InvalidInputError(
            "worker_hw_tier", tier, "None when restoring the baseline (the baseline brings its own tier); "
            "give replicas to restore an explicit size on a tier"
        )
    return count, tier


def validate_wait_replicas(value: object) -> int:
    """A worker count to wait for, or ``ANY_DESIRED`` (-1)."""
    if value == ANY_DESIRED and not isinstance(value, bool):
        return ANY_DESIRED
    try:
        return validate_replicas(value)
    except InvalidInputError:
        raise InvalidInputError("replicas", value, f"-1 (the desired count) or an integer from 0 to {MAX_REPLICAS}") from None
