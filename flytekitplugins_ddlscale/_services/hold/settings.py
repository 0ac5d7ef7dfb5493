"""What a phase asks for (:class:`PhaseOptions`, the keywords of every phase surface), checked when the
phase is defined, and the one check of each option name (:data:`FIELD_CHECKS`) phases and nodes run.
"""
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Callable, ClassVar, Dict, Mapping, Optional, TypedDict, Union

from ...backends._base import DEFAULT_SCALE_TIMEOUT
from ...errors import InvalidInputError
from ..._core.leases import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS
from ...models import ReplicaSpec
from ...refs import ClusterRef, cluster_text, parse_cluster
from ..._core.validation import (
    validate_backend_name,
    validate_bool,
    validate_replicas,
    validate_tier_name,
    validate_timeout,
    validate_url,
)

RESTORE_BASELINE = "baseline"
DEFAULT_REASSERT_INTERVAL = 30.0
"""Seconds between size re-asserts where the backend cannot hold the size itself."""
DEFAULT_SAMPLE_INTERVAL = 5.0
"""Seconds between worker-count samples for the phase's Deck."""

Restore = Union[str, ReplicaSpec]

Check = Callable[[Any], Any]
"""A field's check: the value to keep, or :class:`InvalidInputError` naming the field."""

FIELD_CHECKS: Dict[str, Check] = {
    "cluster": cluster_text,
    "replicas": validate_replicas,
    "worker_hw_tier": validate_tier_name,
    "head_hw_tier": partial(validate_tier_name, field="head_hw_tier"),
    "timeout": validate_timeout,
    "backend": validate_backend_name,
    "framework_url": validate_url,
}
"""The check of each option name wherever it appears."""


class CheckedFields:
    """A (frozen) dataclass whose fields are checked, and normalised, when it is made: each by the class's
    own check of its name (:attr:`checks`), else the shared one (:data:`FIELD_CHECKS`), else, for a
    ``bool`` field, the check that it is one; in the fields' order."""

    checks: ClassVar[Mapping[str, Check]] = {}
    """Checks of what this class's fields mean beyond the shared ones (replacing a shared one of the same name)."""

    def __post_init__(self) -> None:
        for field in fields(self):  # type: ignore[arg-type]
            check = self.checks.get(field.name) or FIELD_CHECKS.get(field.name)
            if check is None and field.type is bool:
                check = partial(validate_bool, field=field.name)
            if check is not None:
                object.__setattr__(self, field.name, check(getattr(self, field.name)))


@dataclass(frozen=True)
class SizedCluster(CheckedFields):
    """What every request to hold a cluster at a size starts with: a phase's, a ``ScaleCluster``'s."""

    cluster: str
    """``kind/name``, ``namespace/kind/name``, or a bare kind for the run's own cluster."""
    replicas: int
    """The worker count to set."""
    worker_hw_tier: Optional[str] = None
    """The workers' hardware tier; None keeps the current one."""
    head_hw_tier: Optional[str] = None
    """The head's hardware tier; None keeps the current one."""


def _interval(value: Optional[float]) -> Optional[float]:
    return None if value is None else validate_timeout(value, "reassert_interval")


def _restore(value: object) -> Restore:
    if value == RESTORE_BASELINE:
        return RESTORE_BASELINE
    if isinstance(value, ReplicaSpec):
        validate_replicas(value.replicas, "restore.replicas")
        validate_tier_name(value.worker_hw_tier, "restore.worker_hw_tier")
        validate_tier_name(value.head_hw_tier, "restore.head_hw_tier")
        return value
    raise InvalidInputError("restore", value, f"{RESTORE_BASELINE!r} or a ReplicaSpec")


class PhaseOptions(TypedDict, total=False):
    """A phase's options beyond its cluster and size (all optional; defaults in :class:`PhaseSettings`).

    ``restore``: ``"baseline"`` (when the last live phase ends, the size outside phases comes back) or
    a :class:`ReplicaSpec`; ``timeout`` bounds the scale-up with its checks, and the restore;
    ``backend`` None is the environment's choice; ``framework_ready`` also waits for workers registered
    with Dask/Ray/Spark where the head is reachable (``framework_url``: where it is, docs/readiness.md);
    ``reassert_interval`` (None: never) where the backend cannot hold the size; ``sample_interval``
    between worker-count samples; ``lease_seconds`` how long the claim outlives its last renewal;
    ``fail_on_fault``: a lost head or lost workers stop the body and raise :class:`ClusterFaultError`.
    """

    worker_hw_tier: Optional[str]
    head_hw_tier: Optional[str]
    restore: Restore
    timeout: float
    backend: Optional[str]
    framework_ready: bool
    framework_url: Optional[str]
    reassert_interval: Optional[float]
    sample_interval: float
    lease_seconds: float
    fail_on_fault: bool


@dataclass(frozen=True)
class PhaseSettings(SizedCluster):
    """The validated arguments of one phase: its cluster and size, :class:`PhaseOptions` and whether to publish
    a page; each checked when made (:data:`FIELD_CHECKS`, or the phase's own check for what only a phase has)."""

    checks: ClassVar[Mapping[str, Check]] = {
        "restore": _restore,
        "reassert_interval": _interval,
        "sample_interval": partial(validate_timeout, field="sample_interval"),
        "lease_seconds": partial(validate_timeout, field="lease_seconds", maximum=MAX_LEASE_SECONDS),
    }

    restore: Restore = RESTORE_BASELINE
    timeout: float = DEFAULT_SCALE_TIMEOUT
    backend: Optional[str] = None
    framework_ready: bool = True
    framework_url: Optional[str] = None
    reassert_interval: Optional[float] = DEFAULT_REASSERT_INTERVAL
    sample_interval: float = DEFAULT_SAMPLE_INTERVAL
    deck: bool = True
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    """How long the phase's claim outlives its last renewal (renewed every third of it)."""
    fail_on_fault: bool = False
    """Fail the phase when its cluster loses its head or workers during the body, instead of
    repairing (where the backend can) and reporting it."""

    def ref(self) -> ClusterRef:
        """The cluster, resolved now (a bare kind needs ``$DOMINO_RUN_ID``)."""
        return parse_cluster(self.cluster)

