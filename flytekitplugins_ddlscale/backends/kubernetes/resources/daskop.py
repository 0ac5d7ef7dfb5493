"""The Dask operator (``kubernetes.dask.org/v1``): a DaskCluster's worker groups.

As ``KubeCluster.scale`` does, the object patched is the DaskWorkerGroup
``<cluster>-<group>`` (``default`` unless a group is named), at
``spec.worker.replicas``; the baseline and claims live on it. The operator
retires the workers it removes through the scheduler, so a scale-down does
not kill busy workers. A DaskAutoscaler (named after the cluster) rewrites
the default group's replicas on every adapt cycle: a size cannot be held
against it, so changes to such a group are refused with an error saying so
(``KubeCluster.scale`` deletes the autoscaler instead; we leave that to the
user). No tiers: a group's pod spec carries its hardware.
"""
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from ....errors import ClusterNotFoundError, InvalidInputError, UnsupportedOperationError
from ....models import Baseline, ClusterState, ReplicaSpec
from ....refs import ClusterRef
from ....tiers import HardwareTier
from ..spec import pod_ready
from .base import Outcome, Patch, Pods, Record, ResourceAdapter, live

if TYPE_CHECKING:
    from ....waiting import Deadline
    from ..api import KubeApi

LABEL_CLUSTER = "dask.org/cluster-name"
LABEL_COMPONENT = "dask.org/component"
LABEL_WORKER_GROUP = "dask.org/workergroup-name"
WORKER_GROUPS = "daskworkergroups"
AUTOSCALERS = "daskautoscalers"
DEFAULT_GROUP = "default"
SCHEDULER_PORT = 8786


def _labels(pod: Dict[str, Any]) -> Dict[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def desired_workers(obj: Dict[str, Any]) -> int:
    """``spec.worker.replicas`` of a DaskWorkerGroup (the CRD's default of 1 when unset)."""
    return int(((obj.get("spec") or {}).get("worker") or {}).get("replicas", 1))


class DaskOperatorAdapter(ResourceAdapter):
    """DaskWorkerGroup objects of a DaskCluster managed by the Dask operator."""

    @property
    def plural(self) -> str:
        return WORKER_GROUPS

    def object_name(self, ref: ClusterRef) -> str:
        return f"{ref.name}-{ref.group if ref.group is not None else DEFAULT_GROUP}"

    def pod_selector(self, ref: ClusterRef, role: Optional[str] = None) -> str:
        base = f"{LABEL_CLUSTER}={ref.name}"
        if role == "head":
            return f"{base},{LABEL_COMPONENT}=scheduler"
        if role == "worker":
            return f"{base},{LABEL_COMPONENT}=worker,{LABEL_WORKER_GROUP}={self.object_name(ref)}"
        return base

    def is_worker(self, pod: Dict[str, Any]) -> bool:
        return _labels(pod).get(LABEL_COMPONENT) == "worker"

    def explain_missing(self, ref: ClusterRef, namespace: str, api: "KubeApi", deadline: Optional["Deadline"]) -> None:
        """A missing worker group of an existing cluster is a bad group name: list the groups."""
        try:
            groups = api.list_clusters(WORKER_GROUPS, namespace, "", self.group, self.version, deadline)
        except ClusterNotFoundError:
            return
        prefix = f"{ref.name}-"
        names = sorted(
            str(g["metadata"]["name"])[len(prefix):] for g in groups
            if (g.get("spec") or {}).get("cluster") == ref.name and str(g["metadata"]["name"]).startswith(prefix)
        )
        if names:
            raise InvalidInputError("group", ref.group if ref.group is not None else DEFAULT_GROUP, ", ".join(names))

    def before_change(
        self, label: str, ref: ClusterRef, namespace: str, api: "KubeApi", deadline: Optional["Deadline"]
    ) -> None:
        """Refuse to change a group a DaskAutoscaler sizes (only the default group is adaptive)."""
        if ref.group not in (None, DEFAULT_GROUP):
            return
        try:
            scaler = api.get_cluster(AUTOSCALERS, namespace, ref.name, deadline, self.group, self.version)
        except ClusterNotFoundError:
            return
        spec = scaler.get("spec") or {}
        raise UnsupportedOperationError(
            f"DaskAutoscaler {ref.name!r} sizes this cluster's default worker group itself (between "
            f"minimum {spec.get('minimum')} and maximum {spec.get('maximum')}), so a size cannot be held "
            "against it; delete the DaskAutoscaler (as KubeCluster.scale does) before scaling this cluster",
            cluster=label,
        )

    def state(self, label: str, ref: ClusterRef, obj: Dict[str, Any], pods: Pods) -> ClusterState:
        group = self.object_name(ref)
        workers = [p for p in live(pods) if self.is_worker(p) and _labels(p).get(LABEL_WORKER_GROUP) == group]
        head_ready = any(pod_ready(p) for p in live(pods) if _labels(p).get(LABEL_COMPONENT) == "scheduler")
        return ClusterState(
            cluster=label,
            # The DaskWorkerGroup has no phase of its own; the scheduler pod tells whether the cluster serves.
            status="Running" if head_ready else "Pending",
            desired_workers=desired_workers(obj),
            existing_workers=len(workers),
            ready_workers=sum(1 for p in workers if pod_ready(p)),
            head_ready=head_ready,
        )

    def baseline(self, label: str, ref: ClusterRef, obj: Dict[str, Any]) -> Record:
        return Baseline(cluster=label, replicas=desired_workers(obj)), {"group": self.object_name(ref)}

    def size_spec(
        self, label: str, ref: ClusterRef, obj: Dict[str, Any], replicas: int, strict: bool,
        tier: Optional[HardwareTier], pods: Pods, record: Optional[Record],
    ) -> Tuple[Patch, int, bool]:
        return {"worker": {"replicas": replicas}}, replicas, False

    def restore_spec(
        self, label: str, ref: ClusterRef, obj: Dict[str, Any], record: Optional[Record],
        target: Optional[ReplicaSpec], worker_tier: Optional[HardwareTier], head_tier: Optional[HardwareTier],
        outcome: Outcome, pods: Pods,
    ) -> Patch:
        if target is not None:
            replicas = target.replicas
        else:
            assert record is not None
            replicas = record[0].replicas
        outcome["effective"] = replicas
        return {"worker": {"replicas": replicas}}

    def connection_env(self, ref: ClusterRef, namespace: str) -> Dict[str, str]:
        """``DASK_SCHEDULER_SERVICE_HOST``/``_PORT``: the ``<name>-scheduler`` service the operator creates."""
        return {
            "DASK_SCHEDULER_SERVICE_HOST": f"{ref.name}-scheduler.{namespace}.svc",
            "DASK_SCHEDULER_SERVICE_PORT": str(SCHEDULER_PORT),
        }
