"""What backends return: observed cluster state and the outcome of an operation, as plain dataclasses with
Flyte-friendly field types (a task can return them as typed outputs)."""
import datetime
from dataclasses import dataclass, field
from typing import Any, Optional


def utcnow() -> datetime.datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.datetime.now(datetime.timezone.utc)


def workers_reached(up: int, desired: int, replicas: int) -> bool:
    """Whether a wait for ``replicas`` workers is done with ``up`` workers up while the cluster wants
    ``desired``: exactly ``replicas`` when it wants exactly that many (a shrink is done once the
    extra workers are gone), at least ``replicas`` when it wants more. A held size is a floor: an
    autoscaler may run the cluster above it, and the wait then ends as soon as ``replicas`` are up
    instead of waiting for every worker the autoscaler added."""
    if desired == replicas:
        return up == replicas
    return desired > replicas and up >= replicas


@dataclass
class ClusterState:
    """One observation of a cluster."""

    cluster: str
    """The cluster as ``[namespace/]kind/name``."""
    status: str
    """``status.clusterStatus``: Pending, Starting, Running, Stopping, Stopped, Failed, or Unknown (the
    open-source operators' states and the local backend's in the same words)."""
    desired_workers: int
    """``spec.worker.replicas``."""
    existing_workers: int
    """Worker pods that exist."""
    ready_workers: Optional[int] = None
    """Worker pods that are Ready; None when this backend cannot observe readiness."""
    head_ready: Optional[bool] = None
    """Whether the head pod is Ready; None when unknown or the kind has no head (MPI)."""
    worker_hw_tier: Optional[str] = None
    """Hardware tier id (or local tier name) of the workers, if labelled."""
    head_hw_tier: Optional[str] = None
    """Hardware tier id (or local tier name) of the head, if labelled."""
    autoscaling_min: Optional[int] = None
    """``spec.autoscaling.minReplicas``; None without autoscaling."""
    autoscaling_max: Optional[int] = None
    """``spec.autoscaling.maxReplicas``; None without autoscaling."""
    observed_at: datetime.datetime = field(default_factory=utcnow)
    """When this observation was made (UTC)."""

    @property
    def autoscaling(self) -> bool:
        """Whether the cluster has an autoscaling section."""
        return self.autoscaling_max is not None

    def workers_up(self, replicas: int, up: Optional[int] = None) -> bool:
        """True when a wait for ``replicas`` workers is done (:func:`workers_reached`), counting ``up``
        if given, else the Ready workers where observable, else the existing ones."""
        if up is None:
            up = self.ready_workers if self.ready_workers is not None else self.existing_workers
        return workers_reached(up, self.desired_workers, replicas)

    def describe(self) -> str:
        """A one-line summary for progress messages and errors."""
        ready = "?" if self.ready_workers is None else str(self.ready_workers)
        return (
            f"{self.cluster} {self.status}: desired={self.desired_workers} "
            f"existing={self.existing_workers} ready={ready}"
        )


@dataclass
class ScaleResult:
    """What a scale call did."""

    cluster: str
    requested: int
    """Workers asked for."""
    effective: int
    """Workers the backend set (``min(requested, maxReplicas)`` unless strict)."""
    capped: bool
    """True when ``effective < requested`` because of ``maxReplicas``."""
    previous: ClusterState
    """State read before the change."""
    final: ClusterState
    """State after the change: after the wait when ``waited``, else right after the request."""
    waited: bool
    seconds_waited: float = 0.0
    worker_hw_tier: Optional[str] = None
    """The tier name requested, if any."""

    @classmethod
    def sent(cls, cluster: str, previous: ClusterState, requested: int, effective: int, **fields: Any) -> "ScaleResult":
        """What a change did before any wait for its workers: ``effective`` of the ``requested`` workers
        set on ``previous``. ``fields``: the result's other fields as they are, ``capped`` (None: when
        fewer were set than requested), ``final`` (None: ``previous``, until the change is read back) and
        ``worker_hw_tier``."""
        if fields.get("capped") is None:
            fields["capped"] = effective < requested
        if fields.get("final") is None:
            fields["final"] = previous
        return cls(cluster, requested, effective, previous=previous, waited=False, **fields)


@dataclass
class RestartResult:
    """What a head restart did."""

    cluster: str
    pod: str
    """Name of the head pod that was replaced."""
    started_at: str
    """When the restart began, as the authority that performed it recorded it (ISO-8601)."""
    ready: bool
    """True when the new head pod was seen Ready."""
    final: ClusterState
    waited: bool
    seconds_waited: float = 0.0
    head_hw_tier: Optional[str] = None
    """The tier name requested for the head, if any."""
    replaced_uid: str = ""
    """The uid of the head pod replaced, where the backend tells heads apart by it (Kubernetes);
    '' otherwise."""


@dataclass
class ReplicaSpec:
    """An explicit size to restore to, instead of the recorded baseline."""

    replicas: int
    worker_hw_tier: Optional[str] = None
    head_hw_tier: Optional[str] = None


@dataclass
class Baseline:
    """What a cluster looked like before this plugin first changed it, recorded before the first change so a
    later task, or another process after a crash, can put it back exactly. Fields as :class:`ClusterState`'s."""

    cluster: str
    replicas: int
    autoscaling_min: Optional[int] = None
    autoscaling_max: Optional[int] = None
    worker_hw_tier: Optional[str] = None
    head_hw_tier: Optional[str] = None
    recorded_at: datetime.datetime = field(default_factory=utcnow)

    @classmethod
    def from_state(cls, state: ClusterState) -> "Baseline":
        """The baseline that restores ``state``."""
        return cls(
            cluster=state.cluster,
            replicas=state.desired_workers,
            autoscaling_min=state.autoscaling_min,
            autoscaling_max=state.autoscaling_max,
            worker_hw_tier=state.worker_hw_tier,
            head_hw_tier=state.head_hw_tier,
        )


__all__ = [
    "Baseline",
    "ClusterState",
    "ReplicaSpec",
    "RestartResult",
    "ScaleResult",
    "utcnow",
    "workers_reached",
]
