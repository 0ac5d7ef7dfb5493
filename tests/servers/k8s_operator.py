"""The distributed-compute operator, its StatefulSets and its HPA, simulated.

A thread beside :class:`~k8s_server.K8sTestServer` that, like the real
operator (docs/kubernetes.md, "The custom resources"), keeps one worker pod
per ``spec.worker.replicas`` (StatefulSet ordinals, highest removed first),
recreates a deleted head pod with a new uid and a newer creationTimestamp,
rolls the head (and workers, one at a time) when their section's
resources, node selector or labels change, marks pods Ready after a delay,
applies injected faults (CrashLoopBackOff, image pull errors, Unschedulable),
keeps ``status`` current and, when enabled, plays the HPA: replicas are kept
within [minReplicas, maxReplicas] and pulled back to minReplicas after a
window without changes.
"""
import copy
import hashlib
import heapq
import json
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Set, Tuple

from flytekitplugins_ddlscale.backends._support.crds import LABEL_APP, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY, LAYOUTS, MANAGED_BY_OPERATOR

PODS = "pods"
REVISION_LABEL = "controller-revision-hash"
FAULTS = ("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "Unschedulable")
DCO_KINDS = {kind: info for kind, info in LAYOUTS.items() if info.flavour == "dco"}
_BY_PLURAL = {info.plural: info for info in DCO_KINDS.values()}
_BY_APP = {info.app: info for info in DCO_KINDS.values()}
ClusterKey = Tuple[str, str, str]


def pod_owner(pod: Dict[str, Any]) -> Optional[Tuple[ClusterKey, str]]:
    """The cluster a pod belongs to (its test-server key) and its role label value, for any operator."""
    from . import oss_operators

    labels = pod["metadata"].get("labels") or {}
    namespace = pod["metadata"]["namespace"]
    info = _BY_APP.get(labels.get(LABEL_APP, ""))
    if info is not None and LABEL_INSTANCE in labels:
        return (info.plural, namespace, labels[LABEL_INSTANCE]), labels.get(LABEL_COMPONENT, "")
    return oss_operators.pod_owner(namespace, labels)


def _iso(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def _revision(section: Dict[str, Any]) -> str:
    template = {k: section.get(k) for k in ("resources", "nodeSelector", "labels")}
    return hashlib.sha1(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


class SimulatedOperator:
    """Reconciles cluster objects into pods on the test server's store."""

    def __init__(self, server: Any, *, ready_delay: float, terminate_delay: float, hpa_window: Optional[float]) -> None:
        self.server = server
        self.ready_delay = ready_delay
        self.terminate_delay = terminate_delay
        self.hpa_window = hpa_window
        self._cluster_delay: Dict[str, float] = {}
        self._faults: Dict[Tuple[str, str, str], Tuple[str, Optional[Set[int]]]] = {}
        self._spared: Set[str] = set()
        """Uids of pods that existed when a ``new_only`` fault was injected."""
        self._due: Dict[str, float] = {}
        """Pod uid -> monotonic time it becomes Ready (or is removed, when terminating)."""
        self._last_replicas: Dict[ClusterKey, Tuple[int, float]] = {}
        self.dask_desired: Dict[Tuple[str, str], int] = {}
        """(namespace, cluster) -> the adaptive target a Dask scheduler reports (0, an idle one, if unset)."""
        self.dask_unreachable: Set[Tuple[str, str]] = set()
        """(namespace, cluster) of Dask schedulers the operator cannot reach."""
        self.dask_held: Set[Tuple[str, str]] = set()
        """(namespace, cluster) of DaskClusters the Dask operator has not reconciled yet."""
        self.held: Set[Tuple[str, str]] = set()
        """(namespace, cluster) of Domino clusters whose operator acts on nothing for now (busy or down)."""
        self._last_created: Dict[Tuple[str, str], float] = {}
        self._dirty: Set[ClusterKey] = set()
        self._timers: List[Tuple[float, ClusterKey]] = []
        self._stop = False
        self._thread: Optional[threading.Thread] = None

    # -- control -----------------------------------------------------------
    def start(self) -> None:
        """Start the reconcile thread."""
        self._thread = threading.Thread(target=self._run, name="k8s-simulated-operator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the reconcile thread and wait for it."""
        with self.server.changed:
            self._stop = True
            self.server.changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def set_ready_delay(self, seconds: float, cluster: Optional[str]) -> None:
        with self.server.lock:
            if cluster is None:
                self.ready_delay = seconds
            else:
                self._cluster_delay[cluster] = seconds

    def set_hpa_window(self, seconds: Optional[float]) -> None:
        with self.server.changed:
            self.hpa_window = seconds
            self._dirty.update(k for k in self._clusters())
            self.server.changed.notify_all()

    def set_dask_desired(self, namespace: str, cluster: str, workers: int) -> None:
        with self.server.changed:
            self.dask_desired[(namespace, cluster)] = workers
            self._dirty.update(k for k in self._clusters())
            self.server.changed.notify_all()

    def set_dask_scheduler_reachable(self, namespace: str, cluster: str, reachable: bool) -> None:
        with self.server.changed:
            (self.dask_unreachable.discard if reachable else self.dask_unreachable.add)((namespace, cluster))
            self._dirty.update(k for k in self._clusters())
            self.server.changed.notify_all()

    def set_dask_operator_held(self, namespace: str, cluster: str, held: bool) -> None:
        with self.server.changed:
            (self.dask_held.add if held else self.dask_held.discard)((namespace, cluster))
            self._dirty.update(k for k in self._clusters())
            self.server.changed.notify_all()

    def set_operator_held(self, namespace: str, cluster: str, held: bool) -> None:
        with self.server.changed:
            (self.held.add if held else self.held.discard)((namespace, cluster))
            self._dirty.update(k for k in self._clusters())
            self.server.changed.notify_all()

    def inject_fault(
        self, namespace: str, cluster: str, component: str, reason: str, ordinals: Optional[List[int]],
        new_only: bool = False,
    ) -> None:
        if reason not in FAULTS:
            raise ValueError(f"reason must be one of {FAULTS}")
        with self.server.changed:
            self._faults[(namespace, cluster, component)] = (reason, set(ordinals) if ordinals is not None else None)
            if new_only:
                self._spared.update(p["metadata"]["uid"] for p in self._owned(namespace, cluster))
            for pod in self._owned(namespace, cluster):
                self._apply_fault(pod)
            self.server.changed.notify_all()

    def clear_faults(self, namespace: str, cluster: str) -> None:
        with self.server.changed:
            faulted = [p for p in self._owned(namespace, cluster) if self._faulted(p)]
            for key in [k for k in self._faults if k[:2] == (namespace, cluster)]:
                del self._faults[key]
            for pod in faulted:
                self._delete(pod)
            self.server.changed.notify_all()

    def _owned(self, namespace: str, cluster: str) -> List[Dict[str, Any]]:
        """Pods of the cluster named ``cluster`` in ``namespace``, whichever operator runs it."""
        found = []
        for (res, ns, _), pod in list(self.server._objects.items()):
            owner = pod_owner(pod) if res == PODS and ns == namespace else None
            if owner is not None and owner[0][2] == cluster:
                found.append(pod)
        return found

    def mark_dirty(self, resource: str, namespace: str, obj: Dict[str, Any]) -> None:
        """Called by the server (holding its lock) on every change."""
        from . import oss_operators

        if resource == PODS:
            owner = pod_owner(obj)
            if owner is not None:
                self._dirty.add(owner[0])
        elif resource in _BY_PLURAL:
            self._dirty.add((resource, namespace, obj["metadata"]["name"]))
        else:
            key = oss_operators.cluster_key(resource, namespace, obj)
            if key is not None:
                self._dirty.add(key)

    def delete_pod(self, namespace: str, name: str) -> Dict[str, Any]:
        """A DELETE from a client: terminate (or remove) the pod; its StatefulSet recreates it."""
        pod = self.server.lookup(PODS, namespace, name)
        return self._delete(pod)

    # -- loop --------------------------------------------------------------
    def _run(self) -> None:
        with self.server.changed:
            while not self._stop:
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    self._dirty.add(heapq.heappop(self._timers)[1])
                dirty, self._dirty = self._dirty, set()
                for key in sorted(dirty):
                    self._reconcile(key, now)
                if self._dirty:
                    continue
                wait = self._timers[0][0] - time.monotonic() if self._timers else 0.5
                self.server.changed.wait(max(0.001, min(wait, 0.5)))

    def _schedule(self, key: ClusterKey, at: float) -> None:
        if (at, key) not in self._timers:
            heapq.heappush(self._timers, (at, key))

    def _clusters(self) -> List[ClusterKey]:
        from . import oss_operators

        return [k for k in self.server._objects if k[0] in _BY_PLURAL or k[0] in oss_operators.CLUSTERS]

    def _pods_of(self, namespace: str, cluster: str, app: Optional[str] = None) -> List[Dict[str, Any]]:
        return [
            o for o in self.server.pods_of_instance(namespace, cluster)
            if app is None or o["metadata"]["labels"].get(LABEL_APP) == app
        ]

    # -- reconcile ---------------------------------------------------------
    def _reconcile(self, key: ClusterKey, now: float) -> None:
        from . import oss_operators

        plural, namespace, name = key
        if plural not in _BY_PLURAL:
            oss_operators.reconcile(self, key, now)
            return
        if (namespace, name) in self.held:
            return
        info = _BY_PLURAL[plural]
        obj = self.server.lookup(plural, namespace, name)
        pods = self._pods_of(namespace, name, info.app)
        if obj is None:
            for pod in pods:
                self.server.commit(PODS, namespace, None, pod["metadata"]["name"], "DELETED")
            return
        replicas = self._hpa(key, obj, now)
        obj = self.server.lookup(plural, namespace, name)
        for pod in pods:
            self._advance(key, pod, now)
        pods = self._pods_of(namespace, name, info.app)
        workers = {p["metadata"]["name"]: p for p in pods if p["metadata"]["labels"][LABEL_COMPONENT] == "worker"}
        worker_section = obj["spec"].get("worker") or {}
        revision = _revision(worker_section)
        for ordinal in range(replicas):
            pod_name = f"{info.worker_pod_prefix(name)}{ordinal}"
            if pod_name not in workers:
                self._create(key, info, obj, "worker", pod_name, ordinal, worker_section, revision, now)
        for pod_name, pod in workers.items():
            if int(pod_name.rsplit("-", 1)[1]) >= replicas and not pod["metadata"].get("deletionTimestamp"):
                self._delete(pod)
        self._roll_workers(workers, replicas, revision)
        if info.head_section:
            head_section = obj["spec"].get(info.head_section) or {}
            head_name = info.head_pod_name(name)
            head = self.server.lookup(PODS, namespace, head_name)
            head_revision = _revision(head_section)
            if head is None:
                self._create(key, info, obj, info.head_component, head_name, 0, head_section, head_revision, now)
            elif head["metadata"]["labels"].get(REVISION_LABEL) != head_revision and not head["metadata"].get("deletionTimestamp"):
                self._delete(head)
        self._update_status(obj, info, replicas)

    def _hpa(self, key: ClusterKey, obj: Dict[str, Any], now: float) -> int:
        worker = obj["spec"].setdefault("worker", {})
        replicas = int(worker.get("replicas", 1))
        last = self._last_replicas.get(key)
        if last is None or last[0] != replicas:
            self._last_replicas[key] = (replicas, now)
            last = (replicas, now)
        auto = obj["spec"].get("autoscaling")
        if auto is None or self.hpa_window is None:
            return replicas
        low, high = int(auto.get("minReplicas") or 1), int(auto["maxReplicas"])
        target = min(max(replicas, low), high)
        if target == replicas and replicas > low:
            if now - last[1] >= self.hpa_window:
                target = low
            else:
                self._schedule(key, last[1] + self.hpa_window)
        if target != replicas:
            changed = copy.deepcopy(obj)
            changed["spec"]["worker"]["replicas"] = target
            changed["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
            self.server.commit(key[0], key[1], changed, key[2], "MODIFIED")
            self._last_replicas[key] = (target, now)
        return target

    def _roll_workers(self, workers: Dict[str, Dict[str, Any]], replicas: int, revision: str) -> None:
        live = [p for n, p in workers.items() if int(n.rsplit("-", 1)[1]) < replicas and not p["metadata"].get("deletionTimestamp")]
        outdated = [p for p in live if p["metadata"]["labels"].get(REVISION_LABEL) != revision]
        if not outdated or len(live) < replicas:
            return
        # A StatefulSet rolls one pod at a time, highest ordinal first, once the rest are Ready.
        if all(_ready(p) for p in live if p not in outdated) and all(_ready(p) or self._faulted(p) for p in outdated):
            self._delete(max(outdated, key=lambda p: int(p["metadata"]["name"].rsplit("-", 1)[1])))

    def _create(
        self, key: ClusterKey, info: Any, obj: Dict[str, Any], component: str, pod_name: str,
        ordinal: int, section: Dict[str, Any], revision: str, now: float,
    ) -> None:
        labels = dict(section.get("labels") or {})
        labels.update({
            LABEL_APP: info.app, LABEL_INSTANCE: key[2], LABEL_COMPONENT: component,
            LABEL_MANAGED_BY: MANAGED_BY_OPERATOR, REVISION_LABEL: revision,
        })
        spec = {
            "nodeSelector": copy.deepcopy(section.get("nodeSelector") or {}),
            "containers": [{"name": info.app, "image": "test", "resources": copy.deepcopy(section.get("resources") or {})}],
        }
        self.create_pod(key, pod_name, labels, spec, now)

    def create_pod(self, key: ClusterKey, pod_name: str, labels: Dict[str, str], spec: Dict[str, Any], now: float) -> None:
        """Add a Pending pod of cluster ``key`` that turns Ready after the ready delay (unless faulted)."""
        namespace, cluster = key[1], key[2]
        container = spec["containers"][0]["name"]
        created = time.time()
        previous = self._last_created.get((namespace, pod_name))
        if previous is not None and int(created) <= int(previous):
            created = int(previous) + 1
        self._last_created[(namespace, pod_name)] = created
        uid = str(uuid.uuid4())
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name, "namespace": namespace, "uid": uid, "labels": labels,
                "creationTimestamp": _iso(created), "generation": 1,
            },
            "spec": spec,
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
                "containerStatuses": [_container_status(container, False, {"waiting": {"reason": "ContainerCreating"}})],
            },
        }
        self._apply_fault(pod, commit=False)
        delay = self._cluster_delay.get(cluster, self.ready_delay)
        self._due[uid] = now + delay
        self._schedule(key, now + delay)
        self.server.commit(PODS, namespace, pod, pod_name, "ADDED")

    def _fault_for(self, pod: Dict[str, Any]) -> Optional[str]:
        owner = pod_owner(pod)
        if owner is None or pod["metadata"]["uid"] in self._spared:
            return None
        entry = self._faults.get((pod["metadata"]["namespace"], owner[0][2], owner[1]))
        if entry is None:
            return None
        reason, ordinals = entry
        suffix = pod["metadata"]["name"].rsplit("-", 1)[1]
        # Operators that name pods randomly (KubeRay, the Dask operator) have no ordinals.
        if ordinals is not None and not (suffix.isdigit() and int(suffix) in ordinals):
            return None
        return reason

    def _faulted(self, pod: Dict[str, Any]) -> bool:
        return self._fault_for(pod) is not None

    def _apply_fault(self, pod: Dict[str, Any], commit: bool = True) -> None:
        reason = self._fault_for(pod)
        if reason is None or pod["metadata"].get("deletionTimestamp"):
            return
        changed = copy.deepcopy(pod)
        status = changed["status"]
        status["conditions"] = [c for c in status["conditions"] if c["type"] not in ("Ready", "PodScheduled")]
        status["conditions"].append({"type": "Ready", "status": "False", "reason": "ContainersNotReady"})
        container = status["containerStatuses"][0]
        container["ready"] = False
        if reason == "Unschedulable":
            status["phase"] = "Pending"
            status["conditions"].append({
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available.",
            })
            container["state"] = {"waiting": {"reason": "ContainerCreating"}}
        else:
            status["conditions"].append({"type": "PodScheduled", "status": "True"})
            messages = {
                "CrashLoopBackOff": f"back-off 40s restarting failed container={container['name']}",
                "ImagePullBackOff": 'Back-off pulling image "test"',
                "ErrImagePull": 'rpc error: code = NotFound desc = failed to pull image "test"',
            }
            status["phase"] = "Running" if reason == "CrashLoopBackOff" else "Pending"
            container["state"] = {"waiting": {"reason": reason, "message": messages[reason]}}
            container["restartCount"] = 3 if reason == "CrashLoopBackOff" else 0
        self._due.pop(pod["metadata"]["uid"], None)
        if commit:
            self.server.commit(PODS, pod["metadata"]["namespace"], changed, pod["metadata"]["name"], "MODIFIED")
        else:
            pod.update(changed)

    def _advance(self, key: ClusterKey, pod: Dict[str, Any], now: float) -> None:
        uid = pod["metadata"]["uid"]
        due = self._due.get(uid)
        if due is None or due > now:
            return
        del self._due[uid]
        name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        if pod["metadata"].get("deletionTimestamp"):
            self.server.commit(PODS, namespace, None, name, "DELETED")
            return
        if self._faulted(pod):
            return
        ready = copy.deepcopy(pod)
        # A running pod has an IP of its own (the Ray head names its nodes by it), here one from its uid.
        ip = "10." + ".".join(str(int(uid[i:i + 2], 16)) for i in (0, 2, 4))
        ready["status"] = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [_container_status(
                pod["spec"]["containers"][0]["name"], True, {"running": {"startedAt": _iso(time.time())}}
            )],
        }
        self.server.commit(PODS, namespace, ready, name, "MODIFIED")

    def delete(self, pod: Dict[str, Any]) -> Dict[str, Any]:
        """Terminate (or remove) ``pod``, as its controller does."""
        return self._delete(pod)

    def advance(self, key: ClusterKey, pod: Dict[str, Any], now: float) -> None:
        """Make ``pod`` Ready (or gone, if terminating) once its delay has passed."""
        self._advance(key, pod, now)

    def faulted(self, pod: Dict[str, Any]) -> bool:
        """Whether an injected fault keeps ``pod`` from starting."""
        return self._faulted(pod)

    def _delete(self, pod: Dict[str, Any]) -> Dict[str, Any]:
        name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        if self.terminate_delay <= 0:
            return self.server.commit(PODS, namespace, None, name, "DELETED")
        if pod["metadata"].get("deletionTimestamp"):
            return pod
        terminating = copy.deepcopy(pod)
        terminating["metadata"]["deletionTimestamp"] = _iso(time.time() + self.terminate_delay)
        terminating["metadata"]["deletionGracePeriodSeconds"] = int(self.terminate_delay) or 1
        now = time.monotonic()
        self._due[pod["metadata"]["uid"]] = now + self.terminate_delay
        owner = pod_owner(pod)
        if owner is not None:
            self._schedule(owner[0], now + self.terminate_delay)
        return self.server.commit(PODS, namespace, terminating, name, "MODIFIED")

    def _update_status(self, obj: Dict[str, Any], info: Any, replicas: int) -> None:
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        pods = self._pods_of(namespace, name, info.app)
        head_ready = any(_ready(p) for p in pods if p["metadata"]["labels"][LABEL_COMPONENT] != "worker")
        workers_ready = sum(1 for p in pods if p["metadata"]["labels"][LABEL_COMPONENT] == "worker" and _ready(p))
        faulted = any(self._faulted(p) for p in pods)
        if info.head_section:
            phase = "Running" if head_ready else ("Failed" if faulted else "Starting")
        else:
            phase = "Running" if workers_ready >= replicas else "Starting"
        status = dict(obj.get("status") or {})
        status.update({
            "clusterStatus": phase,
            "nodes": sorted(p["metadata"]["name"] for p in pods),
            "workerReplicas": replicas,
            "workerSelector": f"{LABEL_INSTANCE}={name},{LABEL_COMPONENT}=worker",
            "image": "test",
        })
        status.setdefault("startTime", _iso(time.time()))
        if status != obj.get("status"):
            changed = copy.deepcopy(obj)
            changed["status"] = status
            self.server.commit(info.plural, namespace, changed, name, "MODIFIED")


def _ready(pod: Dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def _container_status(name: str, ready: bool, state: Dict[str, Any]) -> Dict[str, Any]:
    return {"name": name, "image": "test", "imageID": "", "ready": ready, "restartCount": 0, "state": state}
