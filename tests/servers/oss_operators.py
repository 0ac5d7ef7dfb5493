"""KubeRay and the Dask operator, simulated on the test server's store.

Called by :class:`~k8s_operator.SimulatedOperator` (which owns the timers,
ready delays, faults and pod creation) for the clusters of
:mod:`oss_crds`. Like the real operators:

KubeRay (one RayCluster): a head pod ``<name>-head-<5 chars>`` (recreated
under a new name when deleted); per worker group, pods
``<name>-<group>-worker-<5 chars>``. Pods named in
``scaleStrategy.workersToDelete`` are deleted on every reconcile (by name, as
KubeRay's ``reconcilePods`` does) and the list is left as it is: KubeRay
clears it only in its in-memory copy, never in the object, so names of pods
long gone stay until someone else rewrites the list. The group is kept at
``replicas`` clamped to ``[minReplicas, maxReplicas]``, times ``numOfHosts``
pods (``GetWorkerGroupDesiredReplicas``), none while the group (``suspend``)
or the cluster (``spec.suspend``) is suspended: missing pods are created, and
surplus pods are deleted at random only when ``enableInTreeAutoscaling`` is
off (with it on, KubeRay deletes only what the autoscaler lists). A group
with ``numOfHosts`` above 1 is made of replicas of that many pods sharing the
label ``ray.io/worker-group-replica-name``; a listed pod takes its whole
replica with it (KubeRay's multi-host indexing, on by default). Labels
``ray.io/cluster``, ``ray.io/node-type``, ``ray.io/group``. Status: ``state``
``ready`` once the head and every desired worker are Ready, and the worker
counts. With the server's ``hpa_window`` set, the Ray autoscaler is played:
a group above ``minReplicas`` for that long is brought down to it, listing
its newest workers in ``workersToDelete``.

Dask operator (one DaskCluster): creates the default DaskWorkerGroup
``<name>-default`` from ``spec.worker``, a scheduler pod
``<name>-scheduler-<5 chars>`` (a Deployment: recreated under a new name),
and per DaskWorkerGroup pods ``<group object>-worker-<10 chars>`` to its
``spec.worker.replicas``; surplus workers are removed, those not Ready first,
then the newest (the real operator asks the scheduler which registered
workers to retire, and falls back to the newest pods). When the test makes
the scheduler unreachable (``set_dask_scheduler_reachable``) no worker is
removed and the autoscaler does not adapt: the real operator fails the
retire and retries every 60 s, and skips an adapt cycle without a target. A
cluster the test holds (``set_dask_operator_held``) gets nothing at all, no
default group and no pods, until released: an operator that has not got to it. Labels
``dask.org/cluster-name``, ``dask.org/component``, ``dask.org/workergroup-name``.
With ``hpa_window`` set, a DaskAutoscaler whose ``spec.cluster`` names the
cluster adapts as the real one does (``daskautoscaler_adapt``), one step per
``hpa_window`` (its cooldown): the scheduler's adaptive target (0, an idle
scheduler, unless the test sets one with ``set_dask_desired``) is kept within
``[minimum, maximum]``, a scale-down removes at most a quarter of the replicas
(at least one) per step, and the default group's ``replicas`` is set to it.
"""
import copy
import random
import string
from typing import Any, Dict, List, Optional, Tuple

PODS = "pods"
RAY = "rayclusters.ray.io"
DASK = "daskclusters.kubernetes.dask.org"
DASK_GROUPS = "daskworkergroups.kubernetes.dask.org"
DASK_AUTOSCALERS = "daskautoscalers.kubernetes.dask.org"
CLUSTERS = (RAY, DASK)
"""Resources whose objects are clusters the simulation reconciles."""
ClusterKey = Tuple[str, str, str]
MAX_INT32 = 2147483647


def _suffix(length: int) -> str:
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(length))


def pod_owner(namespace: str, labels: Dict[str, str]) -> Optional[Tuple[ClusterKey, str]]:
    """(cluster key, role) of a KubeRay or Dask-operator pod, else None."""
    if "ray.io/cluster" in labels:
        return (RAY, namespace, labels["ray.io/cluster"]), labels.get("ray.io/node-type", "")
    if "dask.org/cluster-name" in labels:
        return (DASK, namespace, labels["dask.org/cluster-name"]), labels.get("dask.org/component", "")
    return None


def cluster_key(resource: str, namespace: str, obj: Dict[str, Any]) -> Optional[ClusterKey]:
    """The cluster a changed object of ``resource`` belongs to, else None."""
    if resource in CLUSTERS:
        return resource, namespace, obj["metadata"]["name"]
    if resource == DASK_GROUPS:
        return DASK, namespace, str((obj.get("spec") or {}).get("cluster"))
    if resource == DASK_AUTOSCALERS:
        return DASK, namespace, str((obj.get("spec") or {}).get("cluster"))
    return None


def reconcile(sim: Any, key: ClusterKey, now: float) -> None:
    """One reconcile of the cluster ``key``."""
    if key[0] == RAY:
        _Ray(sim, key, now).run()
    else:
        _Dask(sim, key, now).run()


def _live(pods: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: Dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))



def _hosts(group: Dict[str, Any]) -> int:
    """Pods per replica: ``numOfHosts`` (the CRD's default 1; KubeRay treats 0 as 1)."""
    return max(1, int(group.get("numOfHosts") or 1))


def _replicas(pods: List[Dict[str, Any]]) -> List[List[Dict[str, Any]]]:
    """``pods`` by replica: those sharing a ``ray.io/worker-group-replica-name`` together, any other alone."""
    by_name: Dict[str, List[Dict[str, Any]]] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        by_name.setdefault(labels.get("ray.io/worker-group-replica-name") or pod["metadata"]["name"], []).append(pod)
    return list(by_name.values())


def desired_pods(spec: Dict[str, Any], group: Dict[str, Any]) -> int:
    """KubeRay's ``GetWorkerGroupDesiredReplicas``: ``replicas`` within ``[minReplicas, maxReplicas]``
    times ``numOfHosts``; none for a suspended group or cluster."""
    if group.get("suspend") or spec.get("suspend"):
        return 0
    low, high = int(group.get("minReplicas") or 0), int(group.get("maxReplicas", MAX_INT32))
    return min(max(int(group.get("replicas") or 0), low), high) * _hosts(group)


class _Reconcile:
    def __init__(self, sim: Any, key: ClusterKey, now: float) -> None:
        self.sim, self.key, self.now = sim, key, now
        self.server = sim.server
        self.namespace, self.name = key[1], key[2]

    def pods(self, **labels: str) -> List[Dict[str, Any]]:
        return [
            o for (res, ns, _), o in self.server._objects.items()
            if res == PODS and ns == self.namespace
            and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())
        ]

    def drop_all(self, pods: List[Dict[str, Any]]) -> None:
        for pod in pods:
            self.server.commit(PODS, self.namespace, None, pod["metadata"]["name"], "DELETED")

    def create(self, name: str, labels: Dict[str, str], container: str, template: Dict[str, Any]) -> None:
        spec = copy.deepcopy(template) if template else {}
        spec["containers"] = [dict((spec.get("containers") or [{}])[0], name=container, image="test")]
        self.sim.create_pod(self.key, name, labels, spec, self.now)

    def advance(self, pods: List[Dict[str, Any]]) -> None:
        for pod in pods:
            self.sim.advance(self.key, pod, self.now)

    def autoscaler_due(self, marker: Tuple[str, ...], above: bool) -> bool:
        """Whether the emulated autoscaler acts now: ``above`` held for ``hpa_window`` seconds."""
        window = self.sim.hpa_window
        if window is None or not above:
            self.sim._last_replicas.pop(marker, None)
            return False
        since = self.sim._last_replicas.setdefault(marker, (0, self.now))[1]
        if self.now - since >= window:
            self.sim._last_replicas.pop(marker, None)
            return True
        self.sim._schedule(self.key, since + window)
        return False


class _Ray(_Reconcile):
    def run(self) -> None:
        obj = self.server.lookup(RAY, self.namespace, self.name)
        everything = self.pods(**{"ray.io/cluster": self.name})
        if obj is None:
            self.drop_all(everything)
            return
        self.advance(everything)
        obj = self._autoscale(obj)
        self._delete_listed(obj)
        spec = obj["spec"]
        heads = _live(self.pods(**{"ray.io/cluster": self.name, "ray.io/node-type": "head"}))
        if spec.get("suspend"):
            for pod in heads:
                self.sim.delete(pod)
        elif not heads:
            labels = {"ray.io/cluster": self.name, "ray.io/node-type": "head", "ray.io/group": "headgroup",
                      "app.kubernetes.io/created-by": "kuberay-operator"}
            template = (spec.get("headGroupSpec") or {}).get("template") or {}
            self.create(f"{self.name}-head-{_suffix(5)}", labels, "ray-head", template.get("spec") or {})
        desired_total = 0
        for group in spec.get("workerGroupSpecs") or []:
            desired = desired_pods(spec, group)
            desired_total += desired
            name = group["groupName"]
            live = _live(self.pods(**{"ray.io/cluster": self.name, "ray.io/group": name, "ray.io/node-type": "worker"}))
            hosts = _hosts(group)
            for _ in range((desired - len(live)) // hosts):
                replica = f"{name}-{_suffix(5)}"
                for _host in range(hosts):
                    labels = {"ray.io/cluster": self.name, "ray.io/node-type": "worker", "ray.io/group": name,
                              "app.kubernetes.io/created-by": "kuberay-operator"}
                    if hosts > 1:
                        labels["ray.io/worker-group-replica-name"] = replica
                    self.create(f"{self.name}-{name}-worker-{_suffix(5)}", labels, "ray-worker",
                                (group.get("template") or {}).get("spec") or {})
            suspended = bool(group.get("suspend") or spec.get("suspend"))
            if len(live) > desired and (suspended or not spec.get("enableInTreeAutoscaling")):
                replicas = _replicas(live)
                for replica in random.sample(replicas, len(replicas) - desired // hosts):
                    for pod in replica:
                        self.sim.delete(pod)
        self._status(obj, desired_total)

    def _delete_listed(self, obj: Dict[str, Any]) -> None:
        for group in obj["spec"].get("workerGroupSpecs") or []:
            listed = (group.get("scaleStrategy") or {}).get("workersToDelete") or []
            if _hosts(group) > 1:
                ours = self.pods(**{"ray.io/cluster": self.name, "ray.io/group": group["groupName"],
                                    "ray.io/node-type": "worker"})
                replicas = {(p["metadata"].get("labels") or {}).get("ray.io/worker-group-replica-name")
                            for p in ours if p["metadata"]["name"] in listed}
                doomed = [p for p in ours if (p["metadata"].get("labels") or {}).get("ray.io/worker-group-replica-name")
                          in replicas]
            else:
                found = (self.server.lookup(PODS, self.namespace, pod_name) for pod_name in listed)
                doomed = [p for p in found if p is not None]
            for pod in doomed:
                self.sim.delete(pod)

    def _autoscale(self, obj: Dict[str, Any]) -> Dict[str, Any]:
        if not obj["spec"].get("enableInTreeAutoscaling"):
            return obj
        changed = copy.deepcopy(obj)
        for group in changed["spec"].get("workerGroupSpecs") or []:
            low = int(group.get("minReplicas") or 0)
            above = int(group.get("replicas") or 0) > low
            if not self.autoscaler_due((RAY, self.namespace, self.name, group["groupName"]), above):
                continue
            live = _live(self.pods(**{"ray.io/cluster": self.name, "ray.io/group": group["groupName"],
                                      "ray.io/node-type": "worker"}))
            newest = sorted(live, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
            surplus = newest[low:] if len(newest) > low else []
            group["replicas"] = low
            group.setdefault("scaleStrategy", {})["workersToDelete"] = [p["metadata"]["name"] for p in surplus]
        return self._commit(changed, obj)

    def _commit(self, changed: Dict[str, Any], obj: Dict[str, Any]) -> Dict[str, Any]:
        if changed == obj:
            return obj
        if changed["spec"] != obj["spec"]:
            changed["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        return self.server.commit(RAY, self.namespace, changed, self.name, "MODIFIED")

    def _status(self, obj: Dict[str, Any], desired: int) -> None:
        pods = _live(self.pods(**{"ray.io/cluster": self.name}))
        workers = [p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]
        head_ready = any(_ready(p) for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "head")
        ready = sum(1 for p in workers if _ready(p))
        groups = obj["spec"].get("workerGroupSpecs") or []
        status = dict(obj.get("status") or {})
        status.update({
            "readyWorkerReplicas": ready,
            "availableWorkerReplicas": ready,
            "desiredWorkerReplicas": desired,
            "minWorkerReplicas": sum(int(g.get("minReplicas") or 0) for g in groups),
            "maxWorkerReplicas": min(MAX_INT32, sum(int(g.get("maxReplicas", MAX_INT32)) for g in groups)),
            "observedGeneration": obj["metadata"].get("generation", 1),
        })
        if head_ready and ready >= desired:
            status["state"] = "ready"
        if status != obj.get("status"):
            changed = copy.deepcopy(obj)
            changed["status"] = status
            self.server.commit(RAY, self.namespace, changed, self.name, "MODIFIED")


class _Dask(_Reconcile):
    def run(self) -> None:
        obj = self.server.lookup(DASK, self.namespace, self.name)
        everything = self.pods(**{"dask.org/cluster-name": self.name})
        if obj is None:
            self.drop_all(everything)
            return
        if (self.namespace, self.name) in self.sim.dask_held:
            return
        self.advance(everything)
        default = f"{self.name}-default"
        if self.server.lookup(DASK_GROUPS, self.namespace, default) is None:
            group = {
                "apiVersion": "kubernetes.dask.org/v1", "kind": "DaskWorkerGroup",
                "metadata": {"name": default, "namespace": self.namespace, "labels": {"dask.org/cluster-name": self.name}},
                "spec": {"cluster": self.name, "worker": copy.deepcopy(obj["spec"]["worker"])},
            }
            self.server._create(DASK_GROUPS, self.namespace, group)
        scheduler = {"dask.org/cluster-name": self.name, "dask.org/component": "scheduler"}
        if not _live(self.pods(**scheduler)):
            self.create(f"{self.name}-scheduler-{_suffix(5)}", scheduler, "scheduler",
                        obj["spec"]["scheduler"].get("spec") or {})
        self._autoscale(default)
        for (res, ns, name), group in list(self.server._objects.items()):
            if res == DASK_GROUPS and ns == self.namespace and group["spec"].get("cluster") == self.name:
                self._workers(name, group)
        head_ready = any(_ready(p) for p in self.pods(**scheduler))
        status = {"phase": "Running" if head_ready else "Pending"}
        if obj.get("status") != status:
            changed = copy.deepcopy(obj)
            changed["status"] = status
            self.server.commit(DASK, self.namespace, changed, self.name, "MODIFIED")

    def _workers(self, group_name: str, group: Dict[str, Any]) -> None:
        worker = group["spec"]["worker"]
        desired = int(worker.get("replicas", 1))
        labels = {"dask.org/cluster-name": self.name, "dask.org/component": "worker",
                  "dask.org/workergroup-name": group_name}
        live = _live(self.pods(**labels))
        for _ in range(desired - len(live)):
            self.create(f"{group_name}-worker-{_suffix(10)}", labels, "worker", worker.get("spec") or {})
        surplus = len(live) - desired
        if surplus > 0 and (self.namespace, self.name) not in self.sim.dask_unreachable:
            # Pods that never started go first, then the newest (the operator's LIFO fallback).
            order = sorted(live, key=lambda p: (_ready(p), p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
            doomed = [p for p in order if not _ready(p)] + [p for p in reversed(order) if _ready(p)]
            for pod in doomed[:surplus]:
                self.sim.delete(pod)

    def _autoscale(self, default: str) -> None:
        scalers = [
            o for (res, ns, _), o in self.server._objects.items()
            if res == DASK_AUTOSCALERS and ns == self.namespace and (o.get("spec") or {}).get("cluster") == self.name
        ]
        group = self.server.lookup(DASK_GROUPS, self.namespace, default)
        if not scalers or group is None or (self.namespace, self.name) in self.sim.dask_unreachable:
            return
        spec = scalers[0]["spec"]
        current = int(group["spec"]["worker"].get("replicas", 1))
        target = self.sim.dask_desired.get((self.namespace, self.name), 0)
        target = min(int(spec["maximum"]), max(int(spec["minimum"]), target))
        if current > 0:
            target = max(current - max(1, int(current * 0.25)), target)
        if self.autoscaler_due((DASK, self.namespace, self.name), target != current):
            changed = copy.deepcopy(group)
            changed["spec"]["worker"]["replicas"] = target
            changed["metadata"]["generation"] = group["metadata"].get("generation", 1) + 1
            self.server.commit(DASK_GROUPS, self.namespace, changed, default, "MODIFIED")

__all__ = ["CLUSTERS", "cluster_key", "desired_pods", "pod_owner", "reconcile"]
