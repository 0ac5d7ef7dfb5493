"""What a phase asks for, checked when the phase is defined (decorator applied, command parsed)."""
from dataclasses import dataclass
from typing import Optional, Union

from ...backends.base import DEFAULT_SCALE_TIMEOUT
from ...errors import InvalidInputError
from ..._core.validation import validate_url
from ..._core.leases import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS
from ...models import ReplicaSpec
from ...refs import ClusterRef, cluster_text, parse_cluster
from ..._core.validation import validate_replicas, validate_tier_name, validate_timeout

RESTORE_BASELINE = "baseline"
DEFAULT_REASSERT_INTERVAL = 30.0
"""Seconds between size re-asserts where the backend cannot hold the size itself."""
DEFAULT_SAMPLE_INTERVAL = 5.0
"""Seconds between worker-count samples for the phase's Deck."""

Restore = Union[str, ReplicaSpec]


def _interval(field: str, value: Optional[float]) -> Optional[float]:
    return None if value is None else validate_timeout(value, field)


def _restore(value: object) -> Restore:
    if value == RESTORE_BASELINE:
        return RESTORE_BASELINE
    if isinstance(value, ReplicaSpec):
        validate_replicas(value.replicas, "restore.replicas")
        validate_tier_name(value.worker_hw_tier, "restore.worker_hw_tier")
        validate_tier_name(value.head_hw_tier, "restore.head_hw_tier")
        return value
    raise InvalidInputError("restore", value, f"{RESTORE_BASELINE!r} or a ReplicaSpec")


@dataclass(frozen=True)
class PhaseSettings:
    """The validated arguments of one ``@distributed_phase``."""

    cluster: str
    replicas: int
    worker_hw_tier: Optional[str] = None
    head_hw_tier: Optional[str] = None
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "cluster", cluster_text(self.cluster))
        validate_replicas(self.replicas)
        object.__setattr__(self, "worker_hw_tier", validate_tier_name(self.worker_hw_tier))
        object.__setattr__(self, "head_hw_tier", validate_tier_name(self.head_hw_tier, "head_hw_tier"))
        object.__setattr__(self, "restore", _restore(self.restore))
        object.__setattr__(self, "timeout", validate_timeout(self.timeout))
        object.__setattr__(self, "reassert_interval", _interval("reassert_interval", self.reassert_interval))
        object.__setattr__(self, "sample_interval", validate_timeout(self.sample_interval, "sample_interval"))
        object.__setattr__(self, "lease_seconds", validate_timeout(self.lease_seconds, "lease_seconds", MAX_LEASE_SECONDS))
        for name in ("framework_ready", "deck", "fail_on_fault"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInputError(name, getattr(self, name), "True or False")
        object.__setattr__(self, "framework_url", validate_url(self.framework_url))
        if self.backend is not None and (not isinstance(self.backend, str) or not self.backend.strip()):
            raise InvalidInputError("backend", self.backend, "a backend name (scaler, kubernetes, local, ...) or None")

    def ref(self) -> ClusterRef:
        """The cluster, resolved now (a bare kind needs ``$DOMINO_RUN_ID``)."""
        return parse_cluster(self.cluster)
