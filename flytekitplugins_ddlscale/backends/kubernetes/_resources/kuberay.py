"""KubeRay's RayCluster (``ray.io/v1``): one worker group of ``spec.workerGroupSpecs``.

Size: the group's ``replicas``, kept by KubeRay within ``[minReplicas, maxReplicas]`` (above the
maximum capped, refused in strict mode; below the minimum, the minimum follows). With
``enableInTreeAutoscaling`` a phase holds its size by setting ``minReplicas`` to it. A scale-down
names the pods to remove in ``scaleStrategy.workersToDelete``, as the Ray autoscaler does: not Ready
first, then those the Ray head reports idle, then the newest. Counts are pods (``replicas ×
numOfHosts``, none while suspended). No tiers: a group's pod template carries its hardware.
"""
from typing import Any, Dict, List, Optional, Tuple

from ...._core import settings
from ....errors import CapacityExceededError, ConflictError, InvalidInputError, NotScalableError
from ....models import Baseline, ClusterState
from ....refs import GROUP_SEPARATOR, ClusterRef
from .._spec import decode_record, pod_labels, pod_ready
from .base import Outcome, Patch, PodLabels, Pods, Record, ResourceAdapter, Sizing, live, removal_order

LABEL_CLUSTER = "ray.io/cluster"
LABEL_NODE_TYPE = "ray.io/node-type"
LABEL_GROUP = "ray.io/group"
LABEL_REPLICA = "ray.io/worker-group-replica-name"
"""The label KubeRay gives every pod of one replica of a multi-host group (``numOfHosts`` above 1)."""
HEAD_GROUP = "headgroup"
"""The ``ray.io/group`` KubeRay gives the head pod."""
CLIENT_PORT = 10001
POD_LABELS = PodLabels(LABEL_CLUSTER, LABEL_NODE_TYPE, "head", LABEL_GROUP, head_group=HEAD_GROUP)
"""A worker carries its group's name, the head the group ``headgroup``."""


def worker_groups(obj: Dict[str, Any]) -> List[Dict[str, Any]]:
    """``spec.workerGroupSpecs`` (empty when absent)."""
    return list((obj.get("spec") or {}).get("workerGroupSpecs") or [])


def hosts(group: Dict[str, Any]) -> int:
    """Pods per replica of ``group``: ``numOfHosts`` (the CRD's default 1; KubeRay treats 0 as 1)."""
    return max(1, int(group.get("numOfHosts") or 1))


def suspended_by(obj: Dict[str, Any], group: Dict[str, Any]) -> Optional[str]:
    """The field that suspends ``group`` (KubeRay then keeps it at no pods), or None."""
    if group.get("suspend"):
        return f"spec.workerGroupSpecs[groupName={group.get('groupName')}].suspend"
    if (obj.get("spec") or {}).get("suspend"):
        return "spec.suspend"
    return None


def pods_of(obj: Dict[str, Any], group: Dict[str, Any], replicas: Any) -> int:
    """The pods KubeRay keeps for ``replicas`` replicas of ``group``: ``replicas × numOfHosts``, none
    while suspended."""
    return 0 if suspended_by(obj, group) else int(replicas or 0) * hosts(group)


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


def bounds(obj: Dict[str, Any], group: Dict[str, Any]) -> Tuple[Optional[int], Optional[int]]:
    """The Ray autoscaler's bounds of ``group`` in pods (``minReplicas``/``maxReplicas`` × ``numOfHosts``);
    (None, None) without autoscaling, None for a maximum left unset."""
    if not autoscaling_on(obj):
        return None, None
    high = group.get("maxReplicas")
    return int(group.get("minReplicas") or 0) * hosts(group), None if high is None else int(high) * hosts(group)


class KubeRayAdapter(ResourceAdapter):
    """RayCluster objects managed by the KubeRay operator."""

    idle_from_ray_head = True

    def size_setting(self, ref: ClusterRef) -> str:
        # Without a group name the cluster has exactly one group (else the ref is refused): index 0.
        where = f"groupName={ref.group}" if ref.group is not None else "0"
        return f"spec.workerGroupSpecs[{where}].replicas"

    def pod_selector(self, ref: ClusterRef, role: Optional[str] = None) -> str:
        return POD_LABELS.selector(ref.name, role, ref.group)

    def is_worker(self, pod: Dict[str, Any]) -> bool:
        return POD_LABELS.is_worker(pod)

    def _chosen(self, ref: ClusterRef, obj: Dict[str, Any], wanted: Optional[str] = None) -> Tuple[int, Dict[str, Any]]:
        """The index and spec of the worker group ``wanted`` (else the ref's, else the only one)."""
        groups = worker_groups(obj)
        names = [str(g.get("groupName")) for g in groups]
        name = wanted if wanted is not None else ref.group
        if name is None:
            if len(groups) == 1:
                return 0, groups[0]
            if not groups:
                raise NotScalableError("the RayCluster has no worker groups (spec.workerGroupSpecs)", cluster=str(ref))
            raise InvalidInputError(
                "group", None, ", ".join(names),
                reason=f"the RayCluster has {len(groups)} worker groups; choose one as "
                f"'{self.layout.kind}/{ref.name}{GROUP_SEPARATOR}<group>'",
            )
        if name not in names:
            raise InvalidInputError("group", name, ", ".join(names) or "none (the RayCluster has no worker groups)")
        index = names.index(name)
        return index, groups[index]

    def _recorded_group(self, ref: ClusterRef, record: Optional[Record]) -> Optional[str]:
        """The group a recorded baseline belongs to; a ref naming another one is refused."""
        if record is None:
            return None
        recorded = record[1].get("group")
        if ref.group is not None and recorded is not None and ref.group != recorded:
            raise ConflictError(
                f"the recorded baseline belongs to worker group {recorded!r}, not {ref.group!r}; restore "
                f"{self.layout.kind}/{ref.name}{GROUP_SEPARATOR}{recorded} first (one group at a time holds records)",
                cluster=str(ref),
            )
        return recorded

    def state(self, ref: ClusterRef, obj: Dict[str, Any], pods: Pods) -> ClusterState:
        _, group = self._chosen(ref, obj)
        name = group.get("groupName")
        workers = [p for p in live(pods) if self.is_worker(p) and pod_labels(p).get(LABEL_GROUP) == name]
        low, high = bounds(obj, group)
        head_ready = any(pod_ready(p) for p in live(pods) if pod_labels(p).get(LABEL_NODE_TYPE) == "head")
        return ClusterState(
            cluster=str(ref),
            status=cluster_status(obj, head_ready),
            desired_workers=pods_of(obj, group, group.get("replicas")),
            existing_workers=len(workers),
            ready_workers=sum(1 for p in workers if pod_ready(p)),
            head_ready=head_ready,
            autoscaling_min=low,
            autoscaling_max=high,
        )

    def baseline(self, ref: ClusterRef, obj: Dict[str, Any]) -> Record:
        _, group = self._chosen(ref, obj)
        low, high = bounds(obj, group)
        baseline = Baseline(
            cluster=str(ref),
            replicas=pods_of(obj, group, group.get("replicas")),
            autoscaling_min=low,
            autoscaling_max=high,
        )
        # The group's own replicas: the baseline counts pods, which a suspended group has none of.
        return baseline, {
            "group": group.get("groupName"), "minReplicas": group.get("minReplicas"), "replicas": group.get("replicas"),
        }

    def _patched(
        self, obj: Dict[str, Any], index: int, group: Dict[str, Any], replicas: int, low: Any, pods: Pods
    ) -> Patch:
        """``workerGroupSpecs`` with group ``index`` at ``replicas`` replicas and ``minReplicas`` ``low``
        (None: removed), naming the workers to remove. A merge patch replaces the whole list, which is
        safe because the patch carries the resourceVersion it was built from."""
        changed = dict(group, replicas=replicas)
        if low is None:
            changed.pop("minReplicas", None)
        else:
            changed["minReplicas"] = low
        strategy = dict(group.get("scaleStrategy") or {})
        before = list(strategy.get("workersToDelete") or [])
        listed = to_delete(before, [p for p in pods if pod_labels(p).get(LABEL_GROUP) == group.get("groupName")],
                           pods_of(obj, group, replicas))
        if listed != before:
            strategy["workersToDelete"] = listed
            changed["scaleStrategy"] = strategy
        groups = worker_groups(obj)
        groups[index] = changed
        return {"workerGroupSpecs": groups}

    def check_size(self, ref: ClusterRef, obj: Dict[str, Any], replicas: int) -> None:
        """Refuse a suspended group (it has no pods to size) and a count that is not whole replicas of a
        multi-host group, naming the group and the field."""
        _, group = self._chosen(ref, obj, self._recorded_group(ref, decode_record(obj)))
        self._check_group(str(ref), obj, group, replicas)

    def _check_group(self, label: str, obj: Dict[str, Any], group: Dict[str, Any], replicas: int) -> None:
        name = group.get("groupName")
        field = suspended_by(obj, group)
        if field is not None:
            raise NotScalableError(
                f"worker group {name!r} is suspended ({field} is true): KubeRay keeps it at no pods; "
                f"set {field} to false before scaling it", cluster=label,
            )
        per = hosts(group)
        below = replicas - replicas % per
        if replicas % per:
            raise InvalidInputError(
                "replicas", replicas, f"a multiple of {per} (nearest: {below} or {below + per})",
                reason=f"worker group {name!r} has numOfHosts {per} "
                f"(spec.workerGroupSpecs[groupName={name}].numOfHosts): each replica is {per} worker pods",
            )

    def size_spec(
        self, ref: ClusterRef, obj: Dict[str, Any], sizing: Sizing, pods: Pods, record: Optional[Record]
    ) -> Tuple[Patch, int, bool]:
        replicas = sizing.replicas
        index, group = self._chosen(ref, obj, self._recorded_group(ref, record))
        self._check_group(str(ref), obj, group, replicas)
        per = hosts(group)
        wanted, capped = replicas // per, False
        limit = group.get("maxReplicas")
        if limit is not None and wanted > int(limit):
            each = f" of {per} pods each (numOfHosts), {int(limit) * per} workers" if per > 1 else ""
            if sizing.strict:
                raise CapacityExceededError(
                    f"{replicas} workers requested but worker group {group.get('groupName')!r} has "
                    f"maxReplicas {int(limit)}{each} (strict mode)",
                    cluster=str(ref),
                )
            wanted, capped = int(limit), True
        low = group.get("minReplicas")
        if autoscaling_on(obj) or (low is not None and wanted < int(low)):
            low = wanted
        return self._patched(obj, index, group, wanted, low, pods), wanted * per, capped

    def recorded_spec(self, ref: ClusterRef, obj: Dict[str, Any], record: Record, outcome: Outcome, pods: Pods) -> Patch:
        baseline, detail = record
        index, group = self._chosen(ref, obj, self._recorded_group(ref, record))
        # Records written before the group's own replicas were kept hold single-host groups' pods.
        replicas = int(detail["replicas"]) if detail.get("replicas") is not None else baseline.replicas // hosts(group)
        # A group suspended since the record gets its replicas back, but KubeRay keeps it at no pods.
        outcome.effective = pods_of(obj, group, replicas)
        return self._patched(obj, index, group, replicas, detail.get("minReplicas"), pods)

    def connection_env(self, ref: ClusterRef, namespace: str) -> Dict[str, str]:
        """The head service KubeRay creates (``<name>-head-svc``): ``RAY_ADDRESS`` for Ray Client,
        and ``RAY_HEAD_SERVICE_HOST``/``_PORT`` as Domino sets them for its Ray clusters (the
        framework check finds the head's dashboard through them)."""
        host = f"{ref.name}-head-svc.{namespace}.svc"
        return {
            settings.RAY_ADDRESS.name: f"ray://{host}:{CLIENT_PORT}",
            settings.RAY_HEAD_SERVICE_HOST.name: host,
            settings.RAY_HEAD_SERVICE_PORT.name: str(CLIENT_PORT),
        }


def to_delete(listed: List[str], pods: Pods, keep: int) -> List[str]:
    """``scaleStrategy.workersToDelete`` leaving ``keep`` of the group's ``pods``: ``listed`` without the
    names of pods that no longer exist (KubeRay never clears the list), then the workers to remove
    first (:func:`~.base.removal_order`) until the rest is ``keep``. Pods already listed count as
    going. In a multi-host group KubeRay deletes a listed pod's whole replica (the pods sharing its
    ``ray.io/worker-group-replica-name``), so one pod is named per replica."""
    existing = {p["metadata"]["name"] for p in pods}
    kept = [name for name in listed if name in existing]
    replica = {p["metadata"]["name"]: pod_labels(p).get(LABEL_REPLICA) or p["metadata"]["name"] for p in pods}
    going = {replica[name] for name in kept}
    remaining = [p for p in live(pods) if replica[p["metadata"]["name"]] not in going]
    excess = len(remaining) - keep
    for pod in removal_order(remaining):
        if excess <= 0:
            break
        name = pod["metadata"]["name"]
        if replica[name] in going:
            continue
        going.add(replica[name])
        kept.append(name)
        excess -= sum(1 for p in remaining if replica[p["metadata"]["name"]] == replica[name])
    return kept
