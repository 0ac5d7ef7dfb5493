"""A Kubernetes API server for tests: real HTTP on 127.0.0.1, real rules.

It serves the REST paths the official ``kubernetes`` client uses for the DCO
custom resources and for pods, and enforces what a real API server enforces:
merge and JSON patch only on custom resources (415 for strategic merge),
pruning and schema validation against the DCO CRD schemas (:mod:`dco_crds`),
the DCO admission webhook's rules, resourceVersion preconditions (409), label
selectors, watch streams from a resourceVersion with 410 Gone once history is
compacted, 404s, and 403 for verbs a test forbids. A :class:`~k8s_operator.SimulatedOperator`
thread plays the operator, the StatefulSets and the HPA.

Usage::

    with K8sTestServer(ready_delay=0.05) as server:
        server.add_cluster("ray", "c1", replicas=2, autoscaling={"minReplicas": 1, "maxReplicas": 5})
        api = server.api_client()        # kubernetes.client.ApiClient pointed at the server
        server.inject_fault("c1", "CrashLoopBackOff", ordinals=[3])
        server.forbid("patch", "rayclusters")
        server.count("PATCH", "rayclusters")   # requests seen
        server.drop_watches(); server.compact()

Not implemented (answered 415 with a message saying so, never accepted):
server-side apply, and strategic merge patch on pods.
"""
import copy
import datetime
import json
import sys
import threading
import uuid
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple
from urllib.parse import parse_qs, urlsplit

from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION, LABEL_APP, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_OWNER, LAYOUTS

from .dco_crds import CUSTOM_RESOURCES, SCHEMAS
from .oss_crds import OSS_RESOURCES, OSS_SCHEMAS
from .oss_operators import desired_pods
from .k8s_operator import SimulatedOperator
from .k8s_rules import (
    ApiError,
    json_patch,
    merge_patch,
    parse_selector,
    prune,
    selector_matches,
    validate_object,
    webhook_check,
)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PODS = "pods"
Key = Tuple[str, str, str]


ALL_SCHEMAS: Dict[str, Dict[str, Any]] = dict(SCHEMAS, **OSS_SCHEMAS)
"""Every custom resource the server serves, by resource key; built once at import."""


def cluster_object(
    kind: str,
    name: str,
    namespace: str = "domino-compute",
    *,
    replicas: int = 2,
    autoscaling: Optional[Dict[str, Any]] = None,
    worker_resources: Optional[Dict[str, Any]] = None,
    head_resources: Optional[Dict[str, Any]] = None,
    worker_tier: Optional[str] = None,
    head_tier: Optional[str] = None,
    owner: Optional[str] = None,
) -> Dict[str, Any]:
    """A DCO cluster object as :meth:`K8sTestServer.add_cluster` creates it (also sent to a real API server)."""
    info = LAYOUTS[kind]
    resources = worker_resources or {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    worker: Dict[str, Any] = {"replicas": replicas, "resources": copy.deepcopy(resources)}
    if worker_tier:
        worker["labels"] = {"dominodatalab.com/hardware-tier-id": worker_tier}
    spec: Dict[str, Any] = {"image": {"repository": f"{info.app}", "tag": "test"}, "worker": worker}
    if info.kind == "mpi":
        worker["sharedSSHSecret"] = f"{name}-ssh"
    if info.head_section:
        head: Dict[str, Any] = {"resources": copy.deepcopy(head_resources or resources)}
        if head_tier:
            head["labels"] = {"dominodatalab.com/hardware-tier-id": head_tier}
        spec[info.head_section] = head
    if autoscaling is not None:
        spec["autoscaling"] = dict(autoscaling)
    labels = {LABEL_OWNER: owner} if owner else {}
    return {
        "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}",
        "kind": info.crd_kind,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def group_of(resource: str) -> str:
    """API group of a test-server resource key: ``pods`` core, bare plurals Domino's DCO,
    ``<plural>.<group>`` an open-source operator's."""
    if resource == PODS:
        return ""
    return OSS_RESOURCES[resource].group if resource in OSS_RESOURCES else CRD_GROUP


def scale_path_of(resource: str) -> Optional[str]:
    """``specReplicasPath`` of the resource's ``scale`` subresource (None without one, and for pods)."""
    if resource in OSS_RESOURCES:
        return OSS_RESOURCES[resource].scale_spec_path
    scale = CUSTOM_RESOURCES[resource].scale if resource in CUSTOM_RESOURCES else None
    return scale.spec_replicas_path if scale is not None else None


def plural_of(resource: str) -> str:
    """The plural in REST paths and RBAC rules of a test-server resource key."""
    return OSS_RESOURCES[resource].plural if resource in OSS_RESOURCES else resource


def now_iso(offset: float = 0.0) -> str:
    """RFC 3339 UTC timestamp with seconds precision, as Kubernetes writes them."""
    moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RequestRecord:
    """One request the server answered."""

    method: str
    path: str
    query: Dict[str, str]
    content_type: Optional[str]
    status: int = 0
    body: Any = None


@dataclass(eq=False)
class _Watch:
    resource: str
    namespace: str
    selector: list
    dropped: bool = False
    finished: bool = False
    connection: Any = None
    since: int = 0
    """The version up to which this watch has looked at the history (what it has still to send is later)."""


@dataclass
class _Event:
    rv: int
    resource: str
    namespace: str
    type: str
    obj: Dict[str, Any]


class K8sTestServer:
    """A protocol-true Kubernetes API server with a simulated DCO operator.

    Start it as a context manager; ``api_client()`` returns a client for it.
    ``ready_delay`` is how long new pods take to become Ready,
    ``terminate_delay`` how long deleted pods stay Terminating,
    ``hpa_window`` (None = no HPA) after how many seconds the emulated HPA
    pulls ``spec.worker.replicas`` back to ``minReplicas``, ``history_limit``
    how many watch events are kept before old resourceVersions answer 410.
    """

    def __init__(
        self,
        *,
        ready_delay: float = 0.05,
        terminate_delay: float = 0.0,
        hpa_window: Optional[float] = None,
        history_limit: int = 10000,
        user: str = "system:serviceaccount:domino-compute:flyte-runner",
    ) -> None:
        self.user = user
        self.schemas = ALL_SCHEMAS
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.requests: List[RequestRecord] = []
        self._objects: Dict[Key, Dict[str, Any]] = {}
        self._pods_by_instance: Dict[Tuple[str, str], Dict[str, None]] = {}
        """(namespace, instance label) -> pod names in store order: the operator reconciles a cluster
        without scanning every object (at 1,000 clusters that scan, under the lock, held up watches)."""
        self._rv = 1
        self._events: Deque[_Event] = deque()
        self._history_limit = history_limit
        self._min_watch_rv = 0
        self._forbidden: Set[Tuple[str, str]] = set()
        self._allowed: Optional[Set[Tuple[str, str]]] = None
        self._interference: Dict[Key, int] = {}
        self._lost_answers: Dict[str, int] = {}
        self._watches: Set[_Watch] = set()
        self.peak_watches = 0
        self.peak_watches_per_resource = 0
        """The most watch connections open at once on one (namespace, resource) since the start (or
        :meth:`clear_log`): a shared informer keeps one per namespace and resource it reads."""
        """The most watch connections open at once since the start (or :meth:`clear_log`)."""
        self._connections: Set[Any] = set()
        self.connections_accepted = 0
        """TCP connections clients opened since the start (kept-alive connections count once)."""
        self._closing = False
        self._held: Set[str] = set()
        """Resources whose watch events are held back (a lagging watch cache): see :meth:`hold_events`."""
        self.operator = SimulatedOperator(
            self, ready_delay=ready_delay, terminate_delay=terminate_delay, hpa_window=hpa_window
        )
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> "K8sTestServer":
        """Listen on an ephemeral port of 127.0.0.1 and start the operator."""
        server = self

        class Handler(_Handler):
            api = server

        self._httpd = _HTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="k8s-test-server", daemon=True)
        self._thread.start()
        self.operator.start()
        return self

    def close(self) -> None:
        """Stop serving, end every watch and connection, stop the operator."""
        with self.changed:
            self._closing = True
            self.changed.notify_all()
        self.operator.stop()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        with self.lock:
            connections = list(self._connections)
        for conn in connections:
            _shutdown(conn)
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def open_connections(self) -> int:
        """TCP connections open now."""
        with self.lock:
            return len(self._connections)

    def __enter__(self) -> "K8sTestServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def api_client(self, pool_size: int = 16) -> Any:
        """A ``kubernetes.client.ApiClient`` pointed at this server."""
        from kubernetes import client

        config = client.Configuration(host=self.url)
        config.connection_pool_maxsize = pool_size
        return client.ApiClient(config)

    # -- test controls -----------------------------------------------------
    def add_cluster(
        self,
        kind: str,
        name: str,
        namespace: str = "domino-compute",
        *,
        replicas: int = 2,
        autoscaling: Optional[Dict[str, Any]] = None,
        worker_resources: Optional[Dict[str, Any]] = None,
        head_resources: Optional[Dict[str, Any]] = None,
        worker_tier: Optional[str] = None,
        head_tier: Optional[str] = None,
        owner: Optional[str] = None,
        wait_ready: bool = True,
        timeout: float = 10.0,
    ) -> Dict[str, Any]:
        """Create a cluster object (validated like a create) and, by default, wait for its pods.

        Returns the stored object. Raises :class:`ApiError` when the object
        would be refused by the API server or the webhook.
        """
        info = LAYOUTS[kind]
        obj = cluster_object(
            kind, name, namespace, replicas=replicas, autoscaling=autoscaling, worker_resources=worker_resources,
            head_resources=head_resources, worker_tier=worker_tier, head_tier=head_tier, owner=owner,
        )
        with self.lock:
            created = self._create(info.plural, namespace, obj)
        if wait_ready:
            self.wait_for(
                lambda: self.ready_workers(name, namespace, kind) == replicas
                and (info.head_section is None or self.head_ready(name, namespace, kind)),
                timeout,
                f"cluster {name} to come up",
            )
        return created

    def add_kuberay(
        self,
        name: str,
        namespace: str = "domino-compute",
        *,
        groups: Optional[List[Dict[str, Any]]] = None,
        autoscaling: bool = False,
        wait_ready: bool = True,
        timeout: float = 10.0,
    ) -> Dict[str, Any]:
        """Create a KubeRay RayCluster (validated like a create); ``groups`` are worker group specs
        without their template (default: one group ``workers`` of 2). Waits for its pods by default."""
        container = {"containers": [{"name": "ray", "image": "rayproject/ray:2.46.0",
                                     "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}]}
        specs = [dict(g, template={"spec": copy.deepcopy(container)}) for g in (groups or [{"groupName": "workers", "replicas": 2}])]
        obj = {
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "rayVersion": "2.46.0", "enableInTreeAutoscaling": autoscaling,
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": copy.deepcopy(container)}},
                "workerGroupSpecs": specs,
            },
        }
        with self.lock:
            created = self._create("rayclusters.ray.io", namespace, obj)
        if wait_ready:
            wanted = sum(desired_pods(obj["spec"], g) for g in specs)
            self.wait_for(
                lambda: len(self.select_pods(namespace, ready=True, **{"ray.io/cluster": name})) == wanted + 1,
                timeout, f"RayCluster {name} to come up",
            )
        return created

    def add_dask_operator(
        self,
        name: str,
        namespace: str = "domino-compute",
        *,
        replicas: int = 2,
        groups: Optional[Dict[str, int]] = None,
        autoscaler: Optional[Dict[str, int]] = None,
        wait_ready: bool = True,
        timeout: float = 10.0,
    ) -> Dict[str, Any]:
        """Create a Dask-operator DaskCluster (its operator adds the ``default`` worker group), extra
        DaskWorkerGroups ``{group: replicas}`` and optionally a DaskAutoscaler ``{minimum, maximum}``
        (named after the cluster, as ``KubeCluster.adapt`` names it); waits for the pods by default."""
        pod = {"containers": [{"name": "worker", "image": "ghcr.io/dask/dask:latest"}]}
        obj = {
            "apiVersion": "kubernetes.dask.org/v1", "kind": "DaskCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "worker": {"replicas": replicas, "spec": copy.deepcopy(pod)},
                "scheduler": {"spec": copy.deepcopy(pod), "service": {"ports": [{"name": "tcp-comm", "port": 8786}]}},
            },
        }
        with self.lock:
            created = self._create("daskclusters.kubernetes.dask.org", namespace, obj)
            for group, count in (groups or {}).items():
                self._create("daskworkergroups.kubernetes.dask.org", namespace, {
                    "apiVersion": "kubernetes.dask.org/v1", "kind": "DaskWorkerGroup",
                    "metadata": {"name": f"{name}-{group}", "namespace": namespace},
                    "spec": {"cluster": name, "worker": {"replicas": count, "spec": copy.deepcopy(pod)}},
                })
            if autoscaler is not None:
                self._create("daskautoscalers.kubernetes.dask.org", namespace, {
                    "apiVersion": "kubernetes.dask.org/v1", "kind": "DaskAutoscaler",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": dict(autoscaler, cluster=name),
                })
        if wait_ready:
            wanted = replicas + sum((groups or {}).values()) + 1
            self.wait_for(
                lambda: len(self.select_pods(namespace, ready=True, **{"dask.org/cluster-name": name})) == wanted,
                timeout, f"DaskCluster {name} to come up",
            )
        return created

    def get_resource(self, resource: str, name: str, namespace: str = "domino-compute") -> Dict[str, Any]:
        """A copy of a stored object by test-server resource key (``rayclusters.ray.io``...)."""
        with self.lock:
            return copy.deepcopy(self._objects[(resource, namespace, name)])

    def select_pods(self, namespace: str = "domino-compute", *, ready: Optional[bool] = None, **labels: str) -> List[Dict[str, Any]]:
        """Copies of the pods carrying all ``labels`` (``ready``: only Ready / only not Ready), by name."""
        with self.lock:
            found = [
                copy.deepcopy(o) for (res, ns, _), o in self._objects.items()
                if res == PODS and ns == namespace
                and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())
                and (ready is None or pod_ready(o) == ready)
            ]
        return sorted(found, key=lambda p: p["metadata"]["name"])

    def get_object(self, kind: str, name: str, namespace: str = "domino-compute") -> Dict[str, Any]:
        """A copy of the stored cluster object (KeyError when absent)."""
        with self.lock:
            return copy.deepcopy(self._objects[(LAYOUTS[kind].plural, namespace, name)])

    def pods(
        self, name: str, namespace: str = "domino-compute", component: Optional[str] = None, kind: Optional[str] = None
    ) -> List[Dict[str, Any]]:
        """Copies of the cluster's pods (of ``kind``, if several kinds share the name), optionally
        of one component, sorted by name."""
        app = LAYOUTS[kind].app if kind else None
        with self.lock:
            found = [
                copy.deepcopy(o)
                for (res, ns, _), o in self._objects.items()
                if res == PODS
                and ns == namespace
                and o["metadata"]["labels"].get(LABEL_INSTANCE) == name
                and (component is None or o["metadata"]["labels"].get(LABEL_COMPONENT) == component)
                and (app is None or o["metadata"]["labels"].get(LABEL_APP) == app)
            ]
        return sorted(found, key=lambda p: p["metadata"]["name"])

    def ready_workers(self, name: str, namespace: str = "domino-compute", kind: Optional[str] = None) -> int:
        """Worker pods that are Ready and not terminating."""
        return sum(1 for p in self.pods(name, namespace, "worker", kind) if pod_ready(p))

    def head_ready(self, name: str, namespace: str = "domino-compute", kind: Optional[str] = None) -> bool:
        """Whether a non-terminating head pod is Ready."""
        return any(
            pod_ready(p) for p in self.pods(name, namespace, None, kind)
            if p["metadata"]["labels"][LABEL_COMPONENT] != "worker"
        )

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Block until ``predicate()`` holds; AssertionError naming ``what`` after ``timeout``."""
        import time

        end = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > end:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.01)

    def forbid(self, verb: str, resource: str) -> None:
        """Answer 403 (RBAC) to ``verb`` (get, list, watch, patch, update, delete, create) on ``resource``."""
        with self.lock:
            self._forbidden.add((verb, resource))

    def allow_only(self, rules: Set[Tuple[str, str]]) -> None:
        """RBAC as a Role: only these ``(verb, resource)`` pairs are allowed, everything else is 403."""
        with self.lock:
            self._allowed = set(rules)

    def allow_all(self) -> None:
        """Forget every :meth:`forbid` and :meth:`allow_only`."""
        with self.lock:
            self._forbidden.clear()
            self._allowed = None

    def interfere(self, kind: str, name: str, times: int = 1, namespace: str = "domino-compute") -> None:
        """Play a concurrent writer: before each of the next ``times`` PATCHes of this cluster,
        really modify it (an annotation), so a patch carrying the read resourceVersion gets 409."""
        with self.lock:
            self._interference[(LAYOUTS[kind].plural, namespace, name)] = times

    def lose_answers(self, method: str, times: int = 1) -> None:
        """Apply each of the next ``times`` requests of ``method`` (``PATCH``...), then hang up without
        answering: the change is made and the client never hears of it."""
        with self.lock:
            self._lost_answers[method] = times

    def answer_lost(self, method: str) -> bool:
        """Whether the answer to this ``method`` request is to be lost (counts it)."""
        with self.lock:
            left = self._lost_answers.get(method, 0)
            if left > 0:
                self._lost_answers[method] = left - 1
            return left > 0

    def _interfere(self, resource: str, namespace: str, name: str) -> None:
        key = (resource, namespace, name)
        left = self._interference.get(key, 0)
        if left <= 0 or key not in self._objects:
            return
        self._interference[key] = left - 1
        touched = copy.deepcopy(self._objects[key])
        notes = touched["metadata"].setdefault("annotations", {})
        notes["test.example.com/other-writer"] = str(int(notes.get("test.example.com/other-writer", "0")) + 1)
        self.commit(resource, namespace, touched, name, "MODIFIED")

    def set_ready_delay(self, seconds: float, cluster: Optional[str] = None) -> None:
        """How long new pods take to become Ready (for one cluster, or the default)."""
        self.operator.set_ready_delay(seconds, cluster)

    def set_hpa_window(self, seconds: Optional[float]) -> None:
        """Emulate the HPA pulling replicas to minReplicas after ``seconds``; None turns it off."""
        self.operator.set_hpa_window(seconds)

    def set_dask_desired(self, cluster: str, workers: int, namespace: str = "domino-compute") -> None:
        """The adaptive target the Dask scheduler of ``cluster`` reports to its DaskAutoscaler."""
        self.operator.set_dask_desired(namespace, cluster, workers)

    def set_dask_scheduler_reachable(self, cluster: str, reachable: bool, namespace: str = "domino-compute") -> None:
        """Whether the Dask operator reaches the scheduler of ``cluster``: when it cannot, it retires (so
        removes) no worker and its DaskAutoscaler does not adapt, as the real operator."""
        self.operator.set_dask_scheduler_reachable(namespace, cluster, reachable)

    def set_dask_operator_held(self, cluster: str, held: bool, namespace: str = "domino-compute") -> None:
        """Whether the Dask operator has yet to reconcile the DaskCluster ``cluster``: while held it creates
        nothing for it (no default worker group, no pods), as an operator that is slow, busy or down."""
        self.operator.set_dask_operator_held(namespace, cluster, held)

    def set_operator_held(self, cluster: str, held: bool, namespace: str = "domino-compute") -> None:
        """Whether the operator of the Domino cluster ``cluster`` acts on nothing for now (busy or down):
        while held, a changed size starts or removes no pod; released, it catches up."""
        self.operator.set_operator_held(namespace, cluster, held)

    def inject_fault(
        self,
        cluster: str,
        reason: str,
        *,
        ordinals: Optional[List[int]] = None,
        component: str = "worker",
        namespace: str = "domino-compute",
        new_only: bool = False,
    ) -> None:
        """Make pods of ``cluster`` fail with ``reason`` (existing and future ones; only future ones
        with ``new_only``, for operators whose pods have no ordinals).

        ``reason``: ``CrashLoopBackOff``, ``ImagePullBackOff``, ``ErrImagePull`` or
        ``Unschedulable``. ``ordinals`` None means every pod of ``component``.
        """
        self.operator.inject_fault(namespace, cluster, component, reason, ordinals, new_only)

    def clear_faults(self, cluster: str, namespace: str = "domino-compute") -> None:
        """Let the pods of ``cluster`` start normally again."""
        self.operator.clear_faults(namespace, cluster)

    def drop_watches(self) -> int:
        """Cut every open watch connection mid-stream; return how many were cut."""
        with self.changed:
            watches = list(self._watches)
            for watch in watches:
                watch.dropped = True
            self.changed.notify_all()
        for watch in watches:
            if watch.connection is not None:
                _shutdown(watch.connection)
        return len(watches)

    def end_watches(self) -> int:
        """End every open watch as its timeout does (the stream closed in order, nothing cut); return
        how many ended. The client opens a new one: unlike :meth:`drop_watches`, nothing here looks
        like a restarting server."""
        with self.changed:
            watches = list(self._watches)
            for watch in watches:
                watch.finished = True
            self.changed.notify_all()
        return len(watches)

    def hold_events(self, resource: str) -> None:
        """Hold back watch events of ``resource`` (``rayclusters``...) until :meth:`release_events`, as a
        lagging watch cache does: reads and writes are answered, watchers hear nothing new meanwhile."""
        with self.changed:
            self._held.add(resource)

    def release_events(self, resource: str) -> None:
        """Deliver the held events of ``resource`` and every later one."""
        with self.changed:
            self._held.discard(resource)
            self.changed.notify_all()

    def compact(self) -> None:
        """Forget watch history: watches from any earlier resourceVersion get 410 Gone."""
        with self.changed:
            # A running watch still gets every event after the version it has reached, as the API
            # server's watch cache sends it; only a new watch from an earlier version gets 410.
            needed = min((watch.since for watch in self._watches), default=self._rv)
            while self._events and self._events[0].rv <= needed:
                self._events.popleft()
            # Versions handed out so far become too old; lists from now on return a valid one.
            self._rv += 1
            self._min_watch_rv = self._rv
            self.changed.notify_all()

    def count(self, method: Optional[str] = None, contains: Optional[str] = None) -> int:
        """Requests seen with this method (any if None) whose path contains ``contains``."""
        with self.lock:
            return sum(
                1
                for r in self.requests
                if (method is None or r.method == method) and (contains is None or contains in r.path)
            )

    def clear_log(self) -> None:
        """Forget the request log and the peak of open watches."""
        with self.lock:
            self.requests.clear()
            self.peak_watches = len(self._watches)
            self.peak_watches_per_resource = self._most_watches_on_one_resource()

    def _most_watches_on_one_resource(self) -> int:
        per: Dict[Tuple[str, str], int] = {}
        for watch in self._watches:
            per[(watch.namespace, watch.resource)] = per.get((watch.namespace, watch.resource), 0) + 1
        return max(per.values(), default=0)

    def open_watches_of(self, resource: str) -> int:
        """Watch connections open now on ``resource`` (``pods``, ``rayclusters``...)."""
        with self.lock:
            return sum(1 for watch in self._watches if watch.resource == resource)

    @property
    def open_watches(self) -> int:
        """Watch connections open now."""
        with self.lock:
            return len(self._watches)

    # -- store -------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        """The current (latest) resourceVersion."""
        return self._rv

    def commit(self, resource: str, namespace: str, obj: Optional[Dict[str, Any]], name: str, event: str) -> Optional[Dict[str, Any]]:
        """Store (or with ``obj`` None remove) an object under a new resourceVersion and notify watchers."""
        with self.changed:
            self._rv += 1
            key = (resource, namespace, name)
            if obj is None:
                gone = self._objects.pop(key)
                gone["metadata"]["resourceVersion"] = str(self._rv)
                snapshot = gone
            else:
                obj["metadata"]["resourceVersion"] = str(self._rv)
                self._objects[key] = obj
                snapshot = obj
            if resource == PODS:
                self._index_pod(namespace, name, snapshot, present=obj is not None)
            self._events.append(_Event(self._rv, resource, namespace, event, copy.deepcopy(snapshot)))
            while len(self._events) > self._history_limit:
                self._min_watch_rv = self._events.popleft().rv
                # The API server ends the stream of a watcher that falls behind its window (the
                # client resumes, then gets 410) rather than skipping events it has not sent.
                for watch in self._watches:
                    if watch.since < self._min_watch_rv:
                        watch.finished = True
            self.operator.mark_dirty(resource, namespace, snapshot)
            self.changed.notify_all()
            return obj

    def _index_pod(self, namespace: str, name: str, pod: Dict[str, Any], present: bool) -> None:
        instance = (pod["metadata"].get("labels") or {}).get(LABEL_INSTANCE)
        if instance is None:
            return
        names = self._pods_by_instance.setdefault((namespace, instance), {})
        if present:
            names.setdefault(name)
        else:
            names.pop(name, None)

    def pods_of_instance(self, namespace: str, instance: str) -> List[Dict[str, Any]]:
        """The stored pods (not copies) labelled with ``instance`` in ``namespace``, in store order. Hold :attr:`lock`."""
        pods = []
        for name in self._pods_by_instance.get((namespace, instance), ()):
            pod = self._objects.get((PODS, namespace, name))
            # A pod relabelled since it was indexed stays listed under its old instance: check again.
            if pod is not None and (pod["metadata"].get("labels") or {}).get(LABEL_INSTANCE) == instance:
                pods.append(pod)
        return pods

    def lookup(self, resource: str, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        """The stored object itself (not a copy), or None. Hold :attr:`lock`."""
        return self._objects.get((resource, namespace, name))

    def _create(self, resource: str, namespace: str, obj: Dict[str, Any]) -> Dict[str, Any]:
        name = obj.get("metadata", {}).get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if (resource, namespace, name) in self._objects:
            raise ApiError(409, "AlreadyExists", f'{self._qualified(resource)} "{name}" already exists')
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
        if resource != PODS:
            obj = self._admit(resource, obj)
        return copy.deepcopy(self.commit(resource, namespace, obj, name, "ADDED"))

    def _admit(self, resource: str, obj: Dict[str, Any]) -> Dict[str, Any]:
        schema = self.schemas[resource]
        obj = prune(obj, schema)
        kind = obj.get("kind", resource)
        validate_object(obj, schema, kind, group_of(resource), scale_path=scale_path_of(resource))
        if resource not in OSS_RESOURCES:
            webhook_check(obj, kind)
        return obj

    def _qualified(self, resource: str) -> str:
        return resource if resource == PODS or resource in OSS_RESOURCES else f"{resource}.{CRD_GROUP}"

    def _get(self, resource: str, namespace: str, name: str) -> Dict[str, Any]:
        obj = self._objects.get((resource, namespace, name))
        if obj is None:
            raise ApiError(
                404, "NotFound", f'{self._qualified(resource)} "{name}" not found',
                {"name": name, "group": group_of(resource), "kind": plural_of(resource)},
            )
        return obj

    def _list(self, resource: str, namespace: str, selector: list) -> List[Dict[str, Any]]:
        return [
            o
            for (res, ns, _), o in sorted(self._objects.items())
            if res == resource and ns == namespace and selector_matches(selector, o["metadata"].get("labels") or {})
        ]

    def _update(
        self, resource: str, namespace: str, name: str, new: Dict[str, Any], subresource: Optional[str]
    ) -> Dict[str, Any]:
        current = self._get(resource, namespace, name)
        wanted_rv = (new.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and str(wanted_rv) != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409, "Conflict",
                f'Operation cannot be fulfilled on {self._qualified(resource)} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                {"name": name, "group": group_of(resource), "kind": plural_of(resource)},
            )
        new = copy.deepcopy(new)
        meta = new.setdefault("metadata", {})
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp"):
            if fixed in current["metadata"]:
                meta[fixed] = current["metadata"][fixed]
            else:
                meta.pop(fixed, None)
        if resource != PODS and self._has_status_subresource(resource):
            if subresource == "status":
                new["spec"] = copy.deepcopy(current.get("spec"))
                for key in ("labels", "annotations"):
                    meta[key] = copy.deepcopy(current["metadata"].get(key))
            elif "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        if resource != PODS:
            new = self._admit(resource, new)
            if new.get("spec") != current.get("spec"):
                new["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        meta = new["metadata"]
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        if new == current:
            return copy.deepcopy(current)
        return copy.deepcopy(self.commit(resource, namespace, new, name, "MODIFIED"))

    @staticmethod
    def _has_status_subresource(resource: str) -> bool:
        """Whether the CRD has a status subresource (every DCO kind and KubeRay's RayCluster do);
        without one, status is written with the main resource."""
        return resource not in OSS_RESOURCES or OSS_RESOURCES[resource].status_subresource

    def _patch(
        self, resource: str, namespace: str, name: str, content_type: str, body: Any, subresource: Optional[str]
    ) -> Dict[str, Any]:
        media = (content_type or "").split(";")[0].strip()
        if media == STRATEGIC_PATCH and resource != PODS:
            raise ApiError(
                415, "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{JSON_PATCH}, {MERGE_PATCH}, {APPLY_PATCH}",
            )
        if media == MERGE_PATCH:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "merge patch body must be a JSON object")
            patched = merge_patch(self._get(resource, namespace, name), body)
        elif media == JSON_PATCH:
            patched = json_patch(self._get(resource, namespace, name), body)
        else:
            raise ApiError(
                415, "UnsupportedMediaType",
                f"the test server implements only {MERGE_PATCH} and {JSON_PATCH}, got {media!r}",
            )
        return self._update(resource, namespace, name, patched, subresource)

    def _delete_pod(self, namespace: str, name: str, body: Any) -> Dict[str, Any]:
        pod = self._get(PODS, namespace, name)
        pre = (body or {}).get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != pod["metadata"]["uid"]:
            raise ApiError(
                409, "Conflict",
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {pod['metadata']['uid']}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != pod["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "Precondition failed: resourceVersion mismatch")
        return copy.deepcopy(self.operator.delete_pod(namespace, name))

    def check_access(self, verb: str, resource: str, namespace: str, name: Optional[str]) -> None:
        """403 like RBAC when ``verb`` on ``resource`` is forbidden."""
        denied = (verb, resource) in self._forbidden or (verb, resource.split("/")[0]) in self._forbidden
        if self._allowed is not None and (verb, resource) not in self._allowed:
            denied = True
        if not denied:
            return
        base = resource.split("/")[0]
        group = group_of(base)
        subject = f'{self._qualified(base)} "{name}"' if name else self._qualified(base)
        shown = plural_of(base) + resource[len(base):]
        raise ApiError(
            403, "Forbidden",
            f'{subject} is forbidden: User "{self.user}" cannot {verb} resource "{shown}" '
            f'in API group "{group}" in the namespace "{namespace}"',
            {"name": name or "", "group": group, "kind": plural_of(base)},
        )

    # -- watch -------------------------------------------------------------
    def watch_events(self, watch: _Watch, deadline: float) -> Tuple[List[_Event], bool]:
        """Block until events after ``watch.since`` match ``watch``; return (events, ended), ``watch.since``
        moved past what was looked at.

        ``ended`` is True when the watch must end: dropped, timed out or server closing.
        """
        import time

        with self.changed:
            while True:
                if watch.dropped or watch.finished or self._closing or _peer_closed(watch.connection):
                    return [], True
                if watch.resource in self._held:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return [], True
                    self.changed.wait(min(remaining, 0.2))
                    continue
                events = []
                for event in reversed(self._events):
                    if event.rv <= watch.since:
                        break
                    if event.resource == watch.resource and event.namespace == watch.namespace and \
                            selector_matches(watch.selector, event.obj["metadata"].get("labels") or {}):
                        events.append(event)
                events.reverse()
                watch.since = self._rv
                if events:
                    return events, False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return [], True
                # Woken by every change; otherwise look every 0.2 s whether the client hung up.
                self.changed.wait(min(remaining, 0.2))

    def too_old(self, resource_version: int) -> bool:
        """Whether history no longer reaches back to ``resource_version`` (410 Gone)."""
        return resource_version < self._min_watch_rv


def pod_ready(pod: Dict[str, Any]) -> bool:
    """Whether the pod's Ready condition is True and it is not terminating."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def _peer_closed(conn: Any) -> bool:
    """Whether the client closed its end (as an API server notices a cancelled watch request)."""
    import select
    import socket

    if conn is None:
        return False
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _shutdown(conn: Any) -> None:
    import socket

    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


_ROUTE_ERR = ApiError(404, "NotFound", "the server could not find the requested resource")


class _HTTPServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-request (a cancelled wait, a benchmark's child exiting) is
        # ordinary here; anything else still prints its traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, a client's delayed ACK holds
    # every answer on a kept-alive connection ~40 ms (the real API server sets TCP_NODELAY).
    disable_nagle_algorithm = True
    api: K8sTestServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr access log
        return

    def setup(self) -> None:
        super().setup()
        with self.api.lock:
            self.api._connections.add(self.connection)
            self.api.connections_accepted += 1

    def finish(self) -> None:
        with self.api.lock:
            self.api._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_POST(self) -> None:
        self._serve("POST")

    def _route(self, path: str) -> Tuple[str, str, Optional[str], Optional[str]]:
        parts = [p for p in path.split("/") if p]
        if parts[:3] == ["apis", CRD_GROUP, CRD_VERSION] and len(parts) >= 6 and parts[3] == "namespaces":
            rest = parts[4:]
        elif parts[:1] == ["apis"] and len(parts) >= 6 and parts[3] == "namespaces" and any(
            (r.group, r.version, r.plural) == (parts[1], parts[2], parts[5]) for r in OSS_RESOURCES.values()
        ):
            rest = parts[4:]
            rest[1] = f"{rest[1]}.{parts[1]}"
        elif parts[:2] == ["api", "v1"] and len(parts) >= 5 and parts[2] == "namespaces" and parts[4] == PODS:
            rest = parts[3:]
        else:
            raise _ROUTE_ERR
        namespace, resource = rest[0], rest[1]
        if resource != PODS and resource not in self.api.schemas:
            raise _ROUTE_ERR
        name = rest[2] if len(rest) > 2 else None
        sub = rest[3] if len(rest) > 3 else None
        if len(rest) > 4 or (sub is not None and (
            sub != "status" or resource == PODS or not self.api._has_status_subresource(resource)
        )):
            raise _ROUTE_ERR
        return namespace, resource, name, sub

    def _serve(self, method: str) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        record = RequestRecord(method, split.path, query, self.headers.get("Content-Type"))
        with self.api.lock:
            self.api.requests.append(record)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record.body = body
        try:
            namespace, resource, name, sub = self._route(split.path)
            watching = query.get("watch") in ("true", "1")
            verb = {
                "GET": "watch" if watching else ("get" if name else "list"),
                "PATCH": "patch", "PUT": "update", "DELETE": "delete", "POST": "create",
            }[method]
            with self.api.lock:
                self.api.check_access(verb, resource + (f"/{sub}" if sub else ""), namespace, name)
            if verb == "watch":
                record.status = 200
                self._watch(resource, namespace, query)
                return
            with self.api.lock:
                status, payload = self._dispatch(verb, namespace, resource, name, sub, query, body)
        except ApiError as err:
            status, payload = err.code, err.status()
        record.status = status
        if self.api.answer_lost(method):
            self.close_connection = True
            _shutdown(self.connection)
            return
        self._send(status, payload)

    def _dispatch(
        self, verb: str, namespace: str, resource: str, name: Optional[str], sub: Optional[str],
        query: Dict[str, str], body: Any,
    ) -> Tuple[int, Any]:
        api = self.api
        if verb == "get":
            return 200, copy.deepcopy(api._get(resource, namespace, name or ""))
        if verb == "list":
            items = [copy.deepcopy(o) for o in api._list(resource, namespace, parse_selector(query.get("labelSelector")))]
            kind = "PodList" if resource == PODS else items[0]["kind"] + "List" if items else "List"
            return 200, {"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": str(api.resource_version)}, "items": items}
        if verb == "patch":
            api._interfere(resource, namespace, name or "")
            return 200, api._patch(resource, namespace, name or "", self.headers.get("Content-Type", ""), body, sub)
        if verb == "update":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "body must be a JSON object")
            if resource != PODS and not (body.get("metadata") or {}).get("resourceVersion"):
                raise ApiError(422, "Invalid", "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
            return 200, api._update(resource, namespace, name or "", body, sub)
        if verb == "delete" and resource == PODS and name:
            return 200, api._delete_pod(namespace, name, body)
        if verb == "create" and name is None and isinstance(body, dict):
            return 201, api._create(resource, namespace, body)
        raise ApiError(405, "MethodNotAllowed", f"{verb} is not supported on this path by the test server")

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, payload: Dict[str, Any]) -> None:
        data = json.dumps(payload).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, resource: str, namespace: str, query: Dict[str, str]) -> None:
        import time

        api = self.api
        selector = parse_selector(query.get("labelSelector"))
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        watch = _Watch(resource, namespace, selector, connection=self.connection)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with api.lock:
            api._watches.add(watch)
            api.peak_watches = max(api.peak_watches, len(api._watches))
            api.peak_watches_per_resource = max(api.peak_watches_per_resource, api._most_watches_on_one_resource())
            start = query.get("resourceVersion")
            if not start or start == "0":
                watch.since = api.resource_version
                initial = [copy.deepcopy(o) for o in api._list(resource, namespace, selector)]
            else:
                watch.since, initial = int(start), []
                if api.too_old(watch.since):
                    gone = ApiError(410, "Expired", f"too old resource version: {start} ({api._min_watch_rv})")
                    initial = None
        try:
            if initial is None:
                self._chunk({"type": "ERROR", "object": gone.status()})
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            for obj in initial:
                self._chunk({"type": "ADDED", "object": obj})
            while True:
                events, ended = api.watch_events(watch, deadline)
                for event in events:
                    self._chunk({"type": event.type, "object": event.obj})
                if not ended:
                    continue
                if watch.dropped or api._closing:
                    self.close_connection = True
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
        except OSError:
            self.close_connection = True
        finally:
            with api.lock:
                api._watches.discard(watch)
