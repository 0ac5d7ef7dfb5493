"""What a phase asks for, checked when the phase is defined (decorator applied, command parsed).

:class:`PhaseOptions` is the one list of a phase's options: every phase
surface (``@distributed_phase`` for flytekit and for Flyte 2,
``cluster_phase``, ``ddlscale run``) takes exactly these as keywords and hands
them to :class:`PhaseSettings`, which holds their defaults and checks them.
"""
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Mapping, Optional, TypedDict, Union

from ...backends._base import DEFAULT_SCALE_TIMEOUT
from ...errors import InvalidInputError
from ..._core.fieldchecks import Check, SizedCluster
from ..._core.leases import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS
from ...models import ReplicaSpec
from ...refs import ClusterRef, parse_cluster
from ..._core.validation import validate_replicas, validate_tier_name, validate_timeout

RESTORE_BASELINE = "baseline"
DEFAULT_REASSERT_INTERVAL = 30.0
"""Seconds between size re-asserts where the backend cannot hold the size itself."""
DEFAULT_SAMPLE_INTERVAL = 5.0
"""Seconds between worker-count samples for the phase's Deck."""

Restore = Union[str, ReplicaSpec]


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
    """The validated arguments of one phase: its cluster and size, :class:`PhaseOptions` and whether to publish a page.

    Each option is checked when the settings are made, by the check every
    option of its name has (:data:`~flytekitplugins_ddlscale._core.fieldchecks.FIELD_CHECKS`),
    or by the phase's own for what only a phase has.
    """

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

