"""The interface every cluster-resource adapter implements, and what they share."""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, List, Optional, Tuple

from ....errors import ClusterNotFoundError, InvalidInputError
from ....models import Baseline, ClusterState, ReplicaSpec
from ....refs import ClusterRef
from ..._support.crds import CrdLayout
from ...tiers import HardwareTier
from .._spec import pod_labels, pod_ready, pod_terminating

if TYPE_CHECKING:
    from ...._core.records import Claim
    from ...._core.waiting import Deadline
    from .._api import KubeApi

Patch = Dict[str, Any]
Record = Tuple[Baseline, Dict[str, Any]]
"""A recorded baseline and the adapter's own detail (what it needs to put the object back)."""
Pods = List[Dict[str, Any]]
Mutate = Callable[[str, str, Callable[[Dict[str, Any]], Optional[Patch]]], Dict[str, Any]]
"""``mutate(plural, name, build)``: the backend's read-build-patch cycle on another object of the
adapter's API group (resourceVersion-checked, 409 and outages retried, bounded); returns the object
after it. ``build`` returning None changes nothing."""


@dataclass(frozen=True)
class Sizing:
    """What a change sets: ``replicas`` workers, on ``tier`` (None: the tier they have), capped at a
    maximum unless ``strict`` (which refuses instead)."""

    replicas: int
    strict: bool = False
    tier: Optional[HardwareTier] = None


@dataclass(frozen=True)
class Restoring:
    """What a restore sets: ``target``, else the recorded size, and the tiers resolved for it."""

    target: Optional[ReplicaSpec] = None
    worker_tier: Optional[HardwareTier] = None
    head_tier: Optional[HardwareTier] = None


@dataclass
class Outcome:
    """What a change's patch decided, filled in as it is built (again from each re-read); a restore's
    ``effective``, ``capped`` and ``tier`` by :meth:`ResourceAdapter.restore_spec`."""

    effective: int = 0
    """The workers the patch sets."""
    capped: bool = False
    """Whether a maximum set fewer than asked."""
    tier: Optional[str] = None
    """The tier id new workers carry, or None."""
    requested: Optional[int] = None
    """The workers asked for; None while there is nothing to change."""
    tier_name: Optional[str] = None
    """The worker tier asked for, by name."""
    restoring: bool = False
    """Whether the patch puts a recorded size back (no phase holds the cluster)."""
    others: Tuple[str, ...] = ()
    """The other objects sizing the group, held at ``effective`` after the patch."""
    dropped: List[str] = field(default_factory=list)
    """The claims a restore drops, by claim id."""
    dead: Dict[str, Tuple["Claim", str]] = field(default_factory=dict)
    """The dead claims a reconcile drops, each with why."""


class NotCreatedYet(ClusterNotFoundError):
    """The object holding the size is missing while its cluster exists: the operator has not created it
    yet. Not found for every call; a wait for workers takes it as a cluster not ready yet and goes on."""

    pending = True

    def __init__(self, message: str, *, waiting_for: str, desired: int) -> None:
        super().__init__(message)
        self.waiting_for = waiting_for
        """What the wait waits for, as its progress says it, e.g. ``the Dask operator to create ...``."""
        self.desired = desired
        """The workers the cluster asks for (those the missing object will be created with)."""

    def pending_state(self, label: str) -> ClusterState:
        """The state of cluster ``label`` until the object exists: Pending, saying what it waits for,
        no worker (none is made before the object)."""
        return ClusterState(
            cluster=label, status=f"Pending (waiting for {self.waiting_for})", desired_workers=self.desired,
            existing_workers=0, ready_workers=0,
        )


@dataclass(frozen=True)
class PodLabels:
    """How an operator labels a cluster's pods by cluster, role and worker group (KubeRay, the Dask
    operator): the label names differ, the selectors built from them follow one rule."""

    cluster: str
    """The label naming the pod's cluster."""
    role: str
    """The label naming the pod's role: ``worker`` on a worker, :attr:`head` on the head."""
    head: str
    """The role label's value on the head pod."""
    group: str
    """The label naming a worker's group."""
    head_group: Optional[str] = None
    """The group label's value on the head pod where it carries one: the pods of a chosen group are
    then that group's and the head; None: every pod of the cluster."""

    def selector(self, cluster: str, role: Optional[str], group: Optional[str]) -> str:
        """Label selector of ``cluster``'s pods: all (``role`` None), its workers (of ``group``
        when given) or its head."""
        base = f"{self.cluster}={cluster}"
        if role == "head":
            return f"{base},{self.role}={self.head}"
        if role == "worker":
            chosen = f",{self.group}={group}" if group is not None else ""
            return f"{base},{self.role}=worker{chosen}"
        if group is not None and self.head_group is not None:
            return f"{base},{self.group} in ({self.head_group},{group})"
        return base

    def is_worker(self, pod: Dict[str, Any]) -> bool:
        """Whether ``pod`` is labelled a worker."""
        return pod_labels(pod).get(self.role) == "worker"


class ResourceAdapter(ABC):
    """How one flavour of cluster resource is read, sized, held and restored.

    Pure functions of the object and pods given; the backend reads, sends the patches (one merge patch
    carrying the read resourceVersion) and keeps the records in the object's annotations. ``ref`` always
    names its namespace; ``str(ref)`` is the cluster as errors name it.
    """

    tiers = False
    """Whether worker and head hardware tiers can be set (Domino's tier catalog)."""
    idle_from_ray_head = False
    """Whether a scale-down asks the cluster's Ray head which workers are idle (KubeRay)."""

    def __init__(self, layout: CrdLayout) -> None:
        self.layout = layout
        self.group, self.version, self.plural = layout.group, layout.version, layout.plural
        """The API group, version and plural of the patched object's resource."""

    # -- where ---------------------------------------------------------------
    removal = "the operator has not removed them yet: see its log and the cluster's events"
    """Why workers of a scale-down may still be running, for the error of a wait that outlived them."""

    def size_setting(self, ref: ClusterRef) -> str:
        """The field that holds the worker count, as errors name it."""
        return "spec.worker.replicas"

    def object_name(self, ref: ClusterRef) -> str:
        """Name of the object that holds the worker count (and the records): the cluster by default."""
        return ref.name

    def explain_missing(self, ref: ClusterRef, namespace: str, api: "KubeApi", deadline: Optional["Deadline"]) -> None:
        """Called when the object is not found: raise a clearer error if there is one to give."""

    def check_size(self, ref: ClusterRef, obj: Dict[str, Any], replicas: int) -> None:
        """Refuse ``replicas`` workers where the object cannot take them (before a claim records
        them); nothing to refuse by default."""

    def before_change(
        self, ref: ClusterRef, api: "KubeApi", deadline: Optional["Deadline"], replicas: int, strict: bool
    ) -> Tuple[int, bool, Tuple[str, ...]]:
        """Check a change to ``replicas`` workers before anything is sent; return the workers to set,
        whether a bound kept on another object capped them, and the names of the other objects
        that size the group (for :meth:`hold_elsewhere`). No check, no cap, none by default."""
        return replicas, False, ()

    def hold_elsewhere(self, ref: ClusterRef, names: Tuple[str, ...], replicas: int, mutate: Mutate) -> None:
        """After the size patch: hold ``replicas`` on the other objects ``names`` (from
        :meth:`before_change`) that size the group, recording what they had; nothing by default."""

    def restore_elsewhere(self, ref: ClusterRef, api: "KubeApi", deadline: Optional["Deadline"], mutate: Mutate) -> None:
        """Before a restore's patch: put those other objects back as recorded (idempotent); nothing by default."""

    def observe_elsewhere(
        self, ref: ClusterRef, namespace: str, api: "KubeApi", deadline: Optional["Deadline"], state: ClusterState,
        linger: Optional[float] = None,
    ) -> ClusterState:
        """``state`` with what the other objects sizing the group tell (an autoscaler's bounds), read from
        their shared cache given a ``linger`` (as :meth:`cached_elsewhere`); ``state`` itself by default."""
        return state

    def cached_elsewhere(
        self, ref: ClusterRef, namespace: str, api: "KubeApi", state: ClusterState, linger: float
    ) -> Optional[ClusterState]:
        """:meth:`observe_elsewhere` from the running shared caches alone (kept ``linger`` seconds more),
        or None where they cannot answer."""
        return state

    @abstractmethod
    def pod_selector(self, ref: ClusterRef, role: Optional[str] = None) -> str:
        """Label selector of the cluster's pods: all (``role`` None), ``worker`` (of the chosen
        group) or ``head``."""

    @abstractmethod
    def is_worker(self, pod: Dict[str, Any]) -> bool:
        """Whether ``pod`` (one the selector matched) is a worker."""

    # -- reading -------------------------------------------------------------
    @abstractmethod
    def state(self, ref: ClusterRef, obj: Dict[str, Any], pods: Pods) -> ClusterState:
        """The :class:`ClusterState` of the object and the pods its selector matched."""

    @abstractmethod
    def baseline(self, ref: ClusterRef, obj: Dict[str, Any]) -> Record:
        """The baseline of the object as it is now, and the detail a restore needs."""

    # -- changing ------------------------------------------------------------
    @abstractmethod
    def size_spec(
        self, ref: ClusterRef, obj: Dict[str, Any], sizing: Sizing, pods: Pods, record: Optional[Record]
    ) -> Tuple[Patch, int, bool]:
        """The ``spec`` fragment setting ``sizing`` and holding it against the operator's autoscaler; the
        workers it sets and whether a maximum capped them (strict: :class:`CapacityExceededError`)."""

    def restore_spec(
        self, ref: ClusterRef, obj: Dict[str, Any], record: Optional[Record], restoring: Restoring,
        outcome: Outcome, pods: Pods,
    ) -> Patch:
        """The ``spec`` fragment putting back ``record`` (or setting ``restoring.target`` as a scale to its
        replicas would), then its tiers (:meth:`restored_tiers`), filling ``outcome``."""
        if restoring.target is not None:
            spec, outcome.effective, outcome.capped = self.size_spec(
                ref, obj, Sizing(restoring.target.replicas), pods, record
            )
        else:
            assert record is not None
            spec = self.recorded_spec(ref, obj, record, outcome, pods)
        return self.restored_tiers(obj, spec, record, restoring, outcome)

    @abstractmethod
    def recorded_spec(self, ref: ClusterRef, obj: Dict[str, Any], record: Record, outcome: Outcome, pods: Pods) -> Patch:
        """The ``spec`` fragment putting back ``record``'s size, setting ``outcome.effective``."""

    def restored_tiers(
        self, obj: Dict[str, Any], spec: Patch, record: Optional[Record], restoring: Restoring, outcome: Outcome
    ) -> Patch:
        """``spec`` with the worker and head tiers a restore sets (none by default: no tiers here)."""
        return spec

    def notes(self, obj: Dict[str, Any], record: Optional[Record], spec: Patch, restoring: bool) -> Dict[str, Any]:
        """Annotation changes of this flavour that go with ``spec`` (none by default)."""
        return {}

    def head_tier_spec(self, obj: Dict[str, Any], tier: HardwareTier) -> Optional[Patch]:
        """The ``spec`` fragment rolling the head onto ``tier``; None when it is on it already."""
        raise NotImplementedError

    def check_tier(self, ref: ClusterRef, tier: Optional[str], field: str) -> None:
        """Refuse a tier where this flavour has none, naming ``field``."""
        if tier is not None and not self.tiers:
            raise InvalidInputError(
                field, tier,
                f"None: {self.layout.kind} clusters have no Domino hardware tiers; each worker group "
                f"carries its own node selector and resources, so choose the group instead "
                f"('{self.layout.kind}/<name>@<group>')",
            )

    def connection_env(self, ref: ClusterRef, namespace: str) -> Dict[str, str]:
        """The variables user code reads to reach the cluster's head (none by default)."""
        return {}


def live(pods: Pods) -> Pods:
    """Pods not being deleted."""
    return [p for p in pods if not pod_terminating(p)]


IDLE = "ddlscale-idle"
"""Key set on the backend's own copy of a worker pod whose framework head reports it idle (never sent)."""


def mark_idle(pods: Pods, ips: FrozenSet[str]) -> Pods:
    """``pods``, those whose ``status.podIP`` is in ``ips`` copied with :data:`IDLE` set."""
    return [dict(p, **{IDLE: True}) if (p.get("status") or {}).get("podIP") in ips else p for p in pods]


def removal_order(pods: Pods) -> Pods:
    """Which workers to remove first: not Ready before Ready (they do no work yet), then those the
    framework's head reports idle (:func:`mark_idle`), then the newest (least state built up), then by
    name so the choice is stable."""
    ordered = sorted(live(pods), key=lambda p: p["metadata"]["name"])
    ordered.sort(key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True)
    ordered.sort(key=lambda p: not p.get(IDLE))
    ordered.sort(key=pod_ready)
    return ordered
