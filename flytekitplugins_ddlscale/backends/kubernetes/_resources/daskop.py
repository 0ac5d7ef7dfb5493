"""The Dask operator (``kubernetes.dask.org/v1``): a DaskCluster's worker groups.

As ``KubeCluster.scale`` does, the object patched is the DaskWorkerGroup ``<cluster>-<group>``
(``default`` unless a group is named), at ``spec.worker.replicas``; its records live on it. A
DaskAutoscaler sizing the default group is held by raising its ``minimum`` (its own recorded in an
annotation on it, put back by a restore); above its ``maximum`` a size is capped, refused in strict
mode. No tiers: a group's pod spec carries its hardware.
"""
import dataclasses
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ...._core import settings
from ....errors import (
    CapacityExceededError,
    ClusterNotFoundError,
    InvalidInputError,
    UnauthorizedError,
    UnsupportedOperationError,
)
from ....models import Baseline, ClusterState
from ...._core.records import ANNOTATION_PREFIX
from ....refs import ClusterRef
from ..._support.crds import CrdLayout
from .._informer import Resource, cached_objects, note_version
from .._spec import pod_labels, pod_ready
from .base import Mutate, NotCreatedYet, Outcome, Patch, PodLabels, Pods, Record, ResourceAdapter, Sizing, live

if TYPE_CHECKING:
    from ...._core.waiting import Deadline
    from .._api import KubeApi

LABEL_CLUSTER = "dask.org/cluster-name"
LABEL_COMPONENT = "dask.org/component"
LABEL_WORKER_GROUP = "dask.org/workergroup-name"
CLUSTERS = "daskclusters"
WORKER_GROUPS = "daskworkergroups"
AUTOSCALERS = "daskautoscalers"
DEFAULT_GROUP = "default"
SCHEDULER_PORT = 8786
POD_LABELS = PodLabels(LABEL_CLUSTER, LABEL_COMPONENT, "scheduler", LABEL_WORKER_GROUP)
"""The scheduler is the head; every worker carries its DaskWorkerGroup's name."""
HELD_MINIMUM_ANNOTATION = f"{ANNOTATION_PREFIX}/autoscaler-minimum"
"""On a DaskAutoscaler whose ``minimum`` a phase raised: the minimum it had before, put back by a restore."""


def desired_workers(obj: Dict[str, Any]) -> int:
    """``spec.worker.replicas`` of a DaskWorkerGroup (the CRD's default of 1 when unset)."""
    return int(((obj.get("spec") or {}).get("worker") or {}).get("replicas", 1))


def scheduler_status(schedulers: Pods) -> str:
    """The status from the scheduler pods: ``Running`` once one is Ready, ``Starting`` while one exists, else
    ``Pending``. Not the DaskCluster's ``status.phase``, which can stay ``Pending`` while the scheduler
    serves (dask-kubernetes #968)."""
    if any(pod_ready(p) for p in schedulers):
        return "Running"
    return "Starting" if schedulers else "Pending"


class DaskOperatorAdapter(ResourceAdapter):
    """DaskWorkerGroup objects of a DaskCluster managed by the Dask operator."""

    removal = (
        "the Dask operator removes a worker only after retiring it through the cluster's scheduler (the "
        "scheduler Service <cluster>-scheduler.<namespace>: its http-dashboard port's /api/v1/retire_workers, "
        "else the Dask RPC on tcp-comm); when the operator cannot reach the scheduler it removes none and "
        "retries every 60 s: check the operator's log and that the operator can resolve and reach that Service"
    )

    def __init__(self, layout: CrdLayout) -> None:
        super().__init__(layout)
        self.plural = WORKER_GROUPS

    def object_name(self, ref: ClusterRef) -> str:
        return f"{ref.name}-{ref.group if ref.group is not None else DEFAULT_GROUP}"

    def pod_selector(self, ref: ClusterRef, role: Optional[str] = None) -> str:
        return POD_LABELS.selector(ref.name, role, self.object_name(ref))

    def is_worker(self, pod: Dict[str, Any]) -> bool:
        return POD_LABELS.is_worker(pod)

    def explain_missing(self, ref: ClusterRef, namespace: str, api: "KubeApi", deadline: Optional["Deadline"]) -> None:
        """A missing default worker group of an existing DaskCluster is not created yet
        (:class:`~.base.NotCreatedYet`: a wait goes on); a missing other group of an existing cluster is
        a bad group name: list the groups."""
        if ref.group in (None, DEFAULT_GROUP):
            self._not_created_yet(ref, namespace, api, deadline)
            return
        try:
            groups = api.list_objects(Resource(WORKER_GROUPS, self.group, self.version), namespace, deadline=deadline)[0]
        except ClusterNotFoundError:
            return
        prefix = f"{ref.name}-"
        names = sorted(
            str(g["metadata"]["name"])[len(prefix):] for g in groups
            if (g.get("spec") or {}).get("cluster") == ref.name and str(g["metadata"]["name"]).startswith(prefix)
        )
        if names:
            raise InvalidInputError("group", ref.group if ref.group is not None else DEFAULT_GROUP, ", ".join(names))

    def _not_created_yet(
        self, ref: ClusterRef, namespace: str, api: "KubeApi", deadline: Optional["Deadline"]
    ) -> None:
        """Raise :class:`~.base.NotCreatedYet` when DaskCluster ``ref.name`` exists (its operator makes the
        default group from its ``spec.worker``). Nothing when it is missing, or when a Role without get on
        daskclusters cannot tell: the group's not-found stands."""
        try:
            cluster = api.read_object(Resource(CLUSTERS, self.group, self.version), namespace, ref.name, deadline)
        except (ClusterNotFoundError, UnauthorizedError):
            return
        group = self.object_name(ref)
        raise NotCreatedYet(
            f"DaskWorkerGroup {group!r} in namespace {namespace!r} not found: DaskCluster {ref.name!r} exists, "
            "its operator has not created its default worker group yet (is the Dask operator running?)",
            waiting_for=f"the Dask operator to create DaskWorkerGroup {group!r}",
            desired=desired_workers(cluster),
        )

    def _autoscalers(
        self, ref: ClusterRef, namespace: str, api: "KubeApi", deadline: Optional["Deadline"],
        linger: Optional[float] = None,
    ) -> List[Dict[str, Any]]:
        """The DaskAutoscalers sizing ``ref``'s group: those whose ``spec.cluster`` names the cluster,
        when ``ref`` is its default group (the only group an autoscaler sizes); else none.

        Given a ``linger`` (a state report of shared reads, never a decision), from the shared cache of
        DaskAutoscalers where it can answer; every other list goes to the server, and notes the
        versions it read so the cache never answers from before them."""
        if ref.group not in (None, DEFAULT_GROUP):
            return []
        resource = Resource(AUTOSCALERS, self.group, self.version)
        found = cached_objects(api, namespace, resource, linger) if linger is not None else None
        if found is None:
            found = api.list_objects(resource, namespace, deadline=deadline)[0]
            for scaler in found:
                note_version(api, namespace, resource, str(scaler["metadata"]["name"]), scaler)
        return self._sizing(ref, found)

    @staticmethod
    def _sizing(ref: ClusterRef, found: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        return sorted(
            (a for a in found if (a.get("spec") or {}).get("cluster") == ref.name),
            key=lambda a: str(a["metadata"]["name"]),
        )

    def before_change(
        self, ref: ClusterRef, api: "KubeApi", deadline: Optional["Deadline"], replicas: int, strict: bool
    ) -> Tuple[int, bool, Tuple[str, ...]]:
        """Cap ``replicas`` at the DaskAutoscaler's ``maximum`` (strict: refuse, naming both); refuse
        a cluster with more than one autoscaler (they fight each other; which to hold is unclear)."""
        scalers = self._autoscalers(ref, str(ref.namespace), api, deadline)
        if not scalers:
            return replicas, False, ()
        if len(scalers) > 1:
            names = ", ".join(str(a["metadata"]["name"]) for a in scalers)
            raise UnsupportedOperationError(
                f"DaskAutoscalers {names} all size this cluster's default worker group; delete all but one "
                "before scaling it", cluster=str(ref),
            )
        names = (str(scalers[0]["metadata"]["name"]),)
        limit = (scalers[0].get("spec") or {}).get("maximum")
        if limit is None or replicas <= int(limit):
            return replicas, False, names
        if strict:
            raise CapacityExceededError(
                f"{replicas} workers requested but DaskAutoscaler {scalers[0]['metadata']['name']!r} has "
                f"maximum {int(limit)} (strict mode)",
                cluster=str(ref),
            )
        return int(limit), True, names

    def hold_elsewhere(self, ref: ClusterRef, names: Tuple[str, ...], replicas: int, mutate: Mutate) -> None:
        """Set the DaskAutoscaler's ``minimum`` to ``replicas``, so its adapt cycles never go below
        the held size, recording its own minimum on it the first time (same patch)."""
        for name in names:

            def build(current: Dict[str, Any]) -> Optional[Patch]:
                notes = (current.get("metadata") or {}).get("annotations") or {}
                low = (current.get("spec") or {}).get("minimum")
                patch: Patch = {}
                if HELD_MINIMUM_ANNOTATION not in notes:
                    patch["metadata"] = {"annotations": {HELD_MINIMUM_ANNOTATION: str(low if low is not None else 0)}}
                if low != replicas:
                    patch["spec"] = {"minimum": replicas}
                return patch or None

            mutate(AUTOSCALERS, name, build)

    def restore_elsewhere(self, ref: ClusterRef, api: "KubeApi", deadline: Optional["Deadline"], mutate: Mutate) -> None:
        """Put the recorded ``minimum`` back on each DaskAutoscaler that carries one, removing the
        record in the same patch; one without a record is left alone (nothing to undo)."""
        for scaler in self._autoscalers(ref, str(ref.namespace), api, deadline):

            def build(current: Dict[str, Any]) -> Optional[Patch]:
                recorded = ((current.get("metadata") or {}).get("annotations") or {}).get(HELD_MINIMUM_ANNOTATION)
                if recorded is None:
                    return None
                return {"spec": {"minimum": int(recorded)}, "metadata": {"annotations": {HELD_MINIMUM_ANNOTATION: None}}}

            mutate(AUTOSCALERS, str(scaler["metadata"]["name"]), build)

    def observe_elsewhere(
        self, ref: ClusterRef, namespace: str, api: "KubeApi", deadline: Optional["Deadline"], state: ClusterState,
        linger: Optional[float] = None,
    ) -> ClusterState:
        """``state`` with the DaskAutoscaler's ``minimum`` and ``maximum`` as its autoscaling bounds
        (the minimum a phase holds while it holds one); unchanged without exactly one autoscaler."""
        return self._bounded(state, self._autoscalers(ref, namespace, api, deadline, linger))

    def cached_elsewhere(
        self, ref: ClusterRef, namespace: str, api: "KubeApi", state: ClusterState, linger: float
    ) -> Optional[ClusterState]:
        if ref.group not in (None, DEFAULT_GROUP):
            return state
        found = cached_objects(api, namespace, Resource(AUTOSCALERS, self.group, self.version), linger, start=False)
        return None if found is None else self._bounded(state, self._sizing(ref, found))

    @staticmethod
    def _bounded(state: ClusterState, scalers: List[Dict[str, Any]]) -> ClusterState:
        if len(scalers) != 1:
            return state
        spec = scalers[0].get("spec") or {}
        limit = spec.get("maximum")
        return dataclasses.replace(
            state, autoscaling_min=int(spec.get("minimum") or 0), autoscaling_max=None if limit is None else int(limit),
        )

    def state(self, ref: ClusterRef, obj: Dict[str, Any], pods: Pods) -> ClusterState:
        group = self.object_name(ref)
        workers = [p for p in live(pods) if self.is_worker(p) and pod_labels(p).get(LABEL_WORKER_GROUP) == group]
        schedulers = [p for p in live(pods) if pod_labels(p).get(LABEL_COMPONENT) == "scheduler"]
        head_ready = any(pod_ready(p) for p in schedulers)
        return ClusterState(
            cluster=str(ref),
            status=scheduler_status(schedulers),
            desired_workers=desired_workers(obj),
            existing_workers=len(workers),
            ready_workers=sum(1 for p in workers if pod_ready(p)),
            head_ready=head_ready,
        )

    def baseline(self, ref: ClusterRef, obj: Dict[str, Any]) -> Record:
        return Baseline(cluster=str(ref), replicas=desired_workers(obj)), {"group": self.object_name(ref)}

    def size_spec(
        self, ref: ClusterRef, obj: Dict[str, Any], sizing: Sizing, pods: Pods, record: Optional[Record]
    ) -> Tuple[Patch, int, bool]:
        return {"worker": {"replicas": sizing.replicas}}, sizing.replicas, False

    def recorded_spec(self, ref: ClusterRef, obj: Dict[str, Any], record: Record, outcome: Outcome, pods: Pods) -> Patch:
        outcome.effective = record[0].replicas
        return {"worker": {"replicas": record[0].replicas}}

    def connection_env(self, ref: ClusterRef, namespace: str) -> Dict[str, str]:
        """``DASK_SCHEDULER_SERVICE_HOST``/``_PORT``: the ``<name>-scheduler`` service the operator creates."""
        return {
            settings.DASK_SCHEDULER_SERVICE_HOST.name: f"{ref.name}-scheduler.{namespace}.svc",
            settings.DASK_SCHEDULER_SERVICE_PORT.name: str(SCHEDULER_PORT),
        }
