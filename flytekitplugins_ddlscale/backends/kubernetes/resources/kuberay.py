"""KubeRay's RayCluster (``ray.io/v1``): one worker group of ``spec.workerGroupSpecs``.

Size: the group's ``replicas``. KubeRay keeps every group within
``[minReplicas, maxReplicas]``, so a request above ``maxReplicas`` is capped
(refused in strict mode, naming both), and a size below ``minReplicas``
lowers ``minReplicas`` with it. With ``enableInTreeAutoscaling`` the Ray
autoscaler rewrites ``replicas`` itself; a phase holds its size by setting
``minReplicas`` to it (the autoscaler never goes below). Scale-down names
the pods to remove in ``scaleStrategy.workersToDelete``, as the Ray
autoscaler does: KubeRay deletes exactly those (with autoscaling on it
deletes no others), and we choose workers that are not Ready first, then the
newest. Restore puts back the recorded ``replicas`` and ``minReplicas``.
No tiers: a group's pod template carries its hardware.
"""
from typing import Any, Dict, List, Optional, Tuple

from ....errors import CapacityExceededError, ConflictError, InvalidInputError, NotScalableError
from ....models import Baseline, ClusterState, ReplicaSpec
from ....refs import GROUP_SEPARATOR, ClusterRef
from ....tiers import HardwareTier
from ..spec import pod_ready
from .base import Outcome, Patch, Pods, Record, ResourceAdapter, live, removal_order

LABEL_CLUSTER = "ray.io/cluster"
LABEL_NODE_TYPE = "ray.io/node-type"
LABEL_GROUP = "ray.io/group"
HEAD_GROUP = "headgroup"
"""The ``ray.io/group`` KubeRay gives the head pod."""
CLIENT_PORT = 10001


def _labels(pod: Dict[str, Any]) -> Dict[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def worker_groups(obj: Dict[str, Any]) -> List[Dict[str, Any]]:
    """``spec.workerGroupSpecs`` (empty when absent)."""
    return list((obj.get("spec") or {}).get("workerGroupSpecs") or [])


STATES = {"ready": "Running", "failed": "Failed", "suspending": "Stopping", "suspended": "Stopped"}
"""KubeRay's ``status.state`` values in the words every backend's state uses (``unhealthy``, which
KubeRay no longer sets, and anything new fall back to what the head pod says)."""


def cluster_status(obj: Dict[str, Any], head_ready: bool) -> str:
    """The state's status of a RayCluster: its ``status.state`` as KubeRay documents it (``ready``
    is ``Running``), else, before KubeRay has set one, ``Starting`` once the head pod is Ready and
    ``Pending`` until then."""
    state = str((obj.get("status") or {}).get("state") or "")
    return STATES.get(state, "Starting" if head_ready else "Pending")


def autoscaling_on(obj: Dict[str, Any]) -> bool:
    """Whether the Ray autoscaler manages the cluster's size (``enableInTreeAutoscaling``)."""
    return bool((obj.get("spec") or {}).get("enableInTreeAutoscaling"))


class KubeRayAdapter(ResourceAdapter):
    """RayCluster objects managed by the KubeRay operator."""

    def size_setting(self, ref: ClusterRef) -> str:
        # Without a group name the cluster has exactly one group (else the ref is refused): index 0.
        where = f"groupName={ref.group}" if ref.group is not None else "0"
        return f"spec.workerGroupSpecs[{where}].replicas"

    def pod_selector(self, ref: ClusterRef, role: Optional[str] = None) -> str:
        base = f"{LABEL_CLUSTER}={ref.name}"
        if role == "head":
            return f"{base},{LABEL_NODE_TYPE}=head"
        if role == "worker":
            group = f",{LABEL_GROUP}={ref.group}" if ref.group is not None else ""
            return f"{base},{LABEL_NODE_TYPE}=worker{group}"
        if ref.group is not None:
            return f"{base},{LABEL_GROUP} in ({HEAD_GROUP},{ref.group})"
        return base

    def is_worker(self, pod: Dict[str, Any]) -> bool:
        return _labels(pod).get(LABEL_NODE_TYPE) == "worker"

    def _chosen(self, label: str, ref: ClusterRef, obj: Dict[str, Any], wanted: Optional[str] = None) -> Tuple[int, Dict[str, Any]]:
        """The index and spec of the worker group ``wanted`` (else the ref's, else the only one)."""
        groups = worker_groups(obj)
        names = [str(g.get("groupName")) for g in groups]
        name = wanted if wanted is not None else ref.group
        if name is None:
            if len(groups) == 1:
                return 0, groups[0]
            if not groups:
                raise NotScalableError("the RayCluster has no worker groups (spec.workerGroupSpecs)", cluster=label)
            raise InvalidInputError(
                "group", None, ", ".join(names),
                reason=f"the RayCluster has {len(groups)} worker groups; choose one as "
                f"'{self.info.kind}/{ref.name}{GROUP_SEPARATOR}<group>'",
            )
        if name not in names:
            raise InvalidInputError("group", name, ", ".join(names) or "none (the RayCluster has no worker groups)")
        index = names.index(name)
        return index, groups[index]

    def _recorded_group(self, label: str, ref: ClusterRef, record: Optional[Record]) -> Optional[str]:
        """The group a recorded baseline belongs to; a ref naming another one is refused."""
        if record is None:
            return None
        recorded = record[1].get("group")
        if ref.group is not None and recorded is not None and ref.group != recorded:
            raise ConflictError(
                f"the recorded baseline belongs to worker group {recorded!r}, not {ref.group!r}; restore "
                f"{self.info.kind}/{ref.name}{GROUP_SEPARATOR}{recorded} first (one group at a time holds records)",
                cluster=label,
            )
        return recorded

    def state(self, label: str, ref: ClusterRef, obj: Dict[str, Any], pods: Pods) -> ClusterState:
        _, group = self._chosen(label, ref, obj)
        name = group.get("groupName")
        workers = [p for p in live(pods) if self.is_worker(p) and _labels(p).get(LABEL_GROUP) == name]
        auto = autoscaling_on(obj)
        head_ready = any(pod_ready(p) for p in live(pods) if _labels(p).get(LABEL_NODE_TYPE) == "head")
        return ClusterState(
            cluster=label,
            status=cluster_status(obj, head_ready),
            desired_workers=int(group.get("replicas") or 0),
            existing_workers=len(workers),
            ready_workers=sum(1 for p in workers if pod_ready(p)),
            head_ready=head_ready,
            autoscaling_min=int(group.get("minReplicas") or 0) if auto else None,
            autoscaling_max=int(group["maxReplicas"]) if auto and group.get("maxReplicas") is not None else None,
        )

    def baseline(self, label: str, ref: ClusterRef, obj: Dict[str, Any]) -> Record:
        _, group = self._chosen(label, ref, obj)
        auto = autoscaling_on(obj)
        baseline = Baseline(
            cluster=label,
            replicas=int(group.get("replicas") or 0),
            autoscaling_min=int(group.get("minReplicas") or 0) if auto else None,
            autoscaling_max=int(group["maxReplicas"]) if auto and group.get("maxReplicas") is not None else None,
        )
        return baseline, {"group": group.get("groupName"), "minReplicas": group.get("minReplicas")}

    def _patched(
        self, obj: Dict[str, Any], index: int, group: Dict[str, Any], replicas: int, low: Any, pods: Pods
    ) -> Patch:
        """``workerGroupSpecs`` with group ``index`` at ``replicas`` and ``minReplicas`` ``low`` (None:
        removed), naming the workers to remove. A merge patch replaces the whole list, which is
        safe because the patch carries the resourceVersion it was built from."""
        changed = dict(group, replicas=replicas)
        if low is None:
            changed.pop("minReplicas", None)
        else:
            changed["minReplicas"] = low
        ours = [p for p in pods if _labels(p).get(LABEL_GROUP) == group.get("groupName")]
        excess = len(live(ours)) - replicas
        if excess > 0:
            strategy = dict(group.get("scaleStrategy") or {})
            listed = list(strategy.get("workersToDelete") or [])
            listed += [p["metadata"]["name"] for p in removal_order(ours) if p["metadata"]["name"] not in listed][:excess]
            strategy["workersToDelete"] = listed
            changed["scaleStrategy"] = strategy
        groups = worker_groups(obj)
        groups[index] = changed
        return {"workerGroupSpecs": groups}

    def size_spec(
        self, label: str, ref: ClusterRef, obj: Dict[str, Any], replicas: int, strict: bool,
        tier: Optional[HardwareTier], pods: Pods, record: Optional[Record],
    ) -> Tuple[Patch, int, bool]:
        index, group = self._chosen(label, ref, obj, self._recorded_group(label, ref, record))
        effective, capped = replicas, False
        limit = group.get("maxReplicas")
        if limit is not None and replicas > int(limit):
            if strict:
                raise CapacityExceededError(
                    f"{replicas} workers requested but worker group {group.get('groupName')!r} has "
                    f"maxReplicas {int(limit)} (strict mode)",
                    cluster=label,
                )
            effective, capped = int(limit), True
        low = group.get("minReplicas")
        if autoscaling_on(obj) or (low is not None and effective < int(low)):
            low = effective
        return self._patched(obj, index, group, effective, low, pods), effective, capped

    def restore_spec(
        self, label: str, ref: ClusterRef, obj: Dict[str, Any], record: Optional[Record],
        target: Optional[ReplicaSpec], worker_tier: Optional[HardwareTier], head_tier: Optional[HardwareTier],
        outcome: Outcome, pods: Pods,
    ) -> Patch:
        if target is not None:
            spec, outcome["effective"], outcome["capped"] = self.size_spec(
                label, ref, obj, target.replicas, False, None, pods, record
            )
            return spec
        assert record is not None
        baseline, detail = record
        index, group = self._chosen(label, ref, obj, self._recorded_group(label, ref, record))
        outcome["effective"] = baseline.replicas
        return self._patched(obj, index, group, baseline.replicas, detail.get("minReplicas"), pods)

    def connection_env(self, ref: ClusterRef, namespace: str) -> Dict[str, str]:
        """The head service KubeRay creates (``<name>-head-svc``): ``RAY_ADDRESS`` for Ray Client,
        and ``RAY_HEAD_SERVICE_HOST``/``_PORT`` as Domino sets them for its Ray clusters (the
        framework check finds the head's dashboard through them)."""
        host = f"{ref.name}-head-svc.{namespace}.svc"
        return {
            "RAY_ADDRESS": f"ray://{host}:{CLIENT_PORT}",
            "RAY_HEAD_SERVICE_HOST": host,
            "RAY_HEAD_SERVICE_PORT": str(CLIENT_PORT),
        }
