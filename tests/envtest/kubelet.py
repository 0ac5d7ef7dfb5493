"""The kubelet's part for the envtest tier: pods get a node, become Ready, and finish terminating.

The control plane has no scheduler and no kubelet, so pods would stay
Pending for ever. :class:`FakeKubelet` watches every pod and, after
``ready_delay`` seconds, binds it to the node :data:`NODE` (the binding
subresource, as the scheduler does) and writes its status as a kubelet does
(phase Running, PodScheduled, Initialized, ContainersReady and Ready True,
``podIP`` 127.0.0.1, running container statuses). A bound pod that is
deleted gets a ``deletionTimestamp`` (graceful deletion); the kubelet then
removes it with grace period 0 after ``terminate_delay`` seconds. Pods of
``exclude_namespaces`` are left to another kubelet (the flyte tier's
process kubelet, ``tests/flyte_tier/process_kubelet.py``).

:class:`Reactor` is the loop both this and the DCO stand-in run on: a watch
is used only as a wake-up signal, and each pass acts on a fresh list, so a
broken or expired watch never loses anything.
"""
import datetime
import json
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, TypeVar

NODE = "envtest-node"


def iso_now() -> str:
    """The current UTC time as Kubernetes writes it."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reactor:
    """A background thread calling ``act()`` on every change a watch reports, and at least every ``period`` s.

    ``watches`` are callables for ``kubernetes.watch.Watch().stream`` (list
    functions with their arguments bound); ``act`` returns the seconds until
    it wants to run again (None: only on the next change).
    """

    def __init__(self, name: str, watches: List[Callable[..., Any]], act: Callable[[], Optional[float]],
                 period: float = 1.0) -> None:
        self.name = name
        self._watches = watches
        self._act = act
        self._period = period
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self.errors: List[str] = []
        """The last errors ``act`` raised (the loop goes on), for a test's failure message."""

    def start(self) -> "Reactor":
        """Start the watch threads and the loop."""
        for index, call in enumerate(self._watches):
            self._threads.append(threading.Thread(
                target=self._watch, args=(call,), name=f"{self.name}-watch-{index}", daemon=True))
        self._threads.append(threading.Thread(target=self._loop, name=self.name, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def poke(self) -> None:
        """Run ``act`` again soon (after a test changed a setting)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop every thread and wait for them (watches end within their 2 s server timeout)."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _watch(self, call: Callable[..., Any]) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                for _ in watch.Watch().stream(call, timeout_seconds=2):
                    self._wake.set()
                    if self._stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - a broken watch is only a lost wake-up: the loop lists anyway
                self._stop.wait(0.2)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                again = self._act()
            except Exception as exc:  # noqa: BLE001 - kept for the test's message; the next pass retries
                self.errors = (self.errors + [f"{type(exc).__name__}: {exc}"])[-5:]
                again = 0.2
            wait = self._period if again is None else min(max(again, 0.005), self._period)
            self._wake.wait(wait)


WORKERS = 8
"""Requests a stand-in sends at once in one pass: one at a time, a fleet of 1,000 clusters (the benchmarks)
took minutes to come up; a real kubelet per node and a real operator's workers run in parallel too."""
T = TypeVar("T")


def each(act: Callable[[T], None], items: List[T]) -> None:
    """``act(item)`` for every item, :data:`WORKERS` at a time; raises the first error once all are done."""
    if len(items) <= 1:
        for item in items:
            act(item)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(WORKERS, len(items))) as pool:
        futures = [pool.submit(act, item) for item in items]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]


R = TypeVar("R", bound="Reacting")


class Reacting:
    """Start, stop and errors of a stand-in whose work runs in ``self._reactor`` (a :class:`Reactor`)."""

    _reactor: Reactor

    def start(self: R) -> R:
        """Start the stand-in's watches and loop; return it."""
        self._reactor.start()
        return self

    def stop(self) -> None:
        """Stop the watches and the loop."""
        self._reactor.stop()

    @property
    def errors(self) -> List[str]:
        """The last errors of the loop, for a test's failure message."""
        return self._reactor.errors


class FakeKubelet(Reacting):
    """Makes every pod of the API server Ready after ``ready_delay`` s and finishes deletions.

    ``delays`` maps a value of the label ``app.kubernetes.io/instance`` (a
    cluster's name) to its own ready delay. Each of ``ready_listeners`` is
    called as ``listener(pod, sent, None)`` just before the pod's Ready status
    is sent (``sent``: ``time.time()`` then, before any watcher can see it: the
    benchmarks' Ready moments), and as ``listener(pod, sent, accepted)`` once
    the API server accepted it. Pods in ``exclude_namespaces`` are never touched (not bound, made Ready nor
    removed); the set may grow while it runs (call :meth:`Reactor.poke` or wait for the next change).
    """

    def __init__(self, api_client: Any, ready_delay: float = 0.1, terminate_delay: float = 0.0,
                 exclude_namespaces: Iterable[str] = ()) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.exclude_namespaces: Set[str] = set(exclude_namespaces)
        self.ready_delay = ready_delay
        self.terminate_delay = terminate_delay
        self.delays: Dict[str, float] = {}
        self.ready_listeners: List[Callable[[Dict[str, Any], float, Optional[float]], None]] = []
        self._seen: Dict[str, float] = {}
        self._reactor = Reactor("envtest-kubelet", [self.core.list_pod_for_all_namespaces], self._act, period=1.0)

    def set_ready_delay(self, seconds: float, cluster: Optional[str] = None) -> None:
        """How long new pods (of one cluster, or all) take to become Ready."""
        if cluster is None:
            self.ready_delay = seconds
        else:
            self.delays[cluster] = seconds
        self._reactor.poke()

    def _act(self) -> Optional[float]:
        now = time.monotonic()
        items = json.loads(self.core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
        alive = set()
        soonest: Optional[float] = None
        finishing: List[Dict[str, Any]] = []
        starting: List[Dict[str, Any]] = []
        for pod in items:
            meta = pod["metadata"]
            if meta["namespace"] in self.exclude_namespaces:
                continue
            alive.add(meta["uid"])
            first = self._seen.setdefault(meta["uid"], now)
            if meta.get("deletionTimestamp"):
                due = first if self.terminate_delay <= 0 else self._seen.setdefault(meta["uid"] + "/gone", now)
                due += self.terminate_delay
                if due <= now:
                    finishing.append(meta)
                else:
                    soonest = due if soonest is None else min(soonest, due)
                continue
            if _ready(pod):
                continue
            instance = (meta.get("labels") or {}).get("app.kubernetes.io/instance", "")
            due = first + self.delays.get(instance, self.ready_delay)
            if due <= now:
                starting.append(pod)
            else:
                soonest = due if soonest is None else min(soonest, due)
        each(self._finish, finishing)
        each(self._run, starting)
        for uid in [u for u in self._seen if u.split("/")[0] not in alive]:
            del self._seen[uid]
        return None if soonest is None else soonest - time.monotonic()

    def _run(self, pod: Dict[str, Any]) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        try:
            if not pod["spec"].get("nodeName"):
                # Preconditions ride on the target's uid: a pod recreated under the same name is not bound by mistake.
                binding = client.V1Binding(
                    metadata=client.V1ObjectMeta(name=name, uid=meta["uid"]),
                    target=client.V1ObjectReference(kind="Node", name=NODE),
                )
                self.core.create_namespaced_binding(namespace, binding, _preload_content=False)
            stamp = iso_now()
            conditions = [{"type": t, "status": "True", "lastTransitionTime": stamp}
                          for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
            statuses = [{
                "name": c["name"], "image": c.get("image") or "test", "imageID": "", "ready": True, "started": True,
                "restartCount": 0, "state": {"running": {"startedAt": stamp}},
            } for c in pod["spec"]["containers"]]
            sent = time.time()
            for listener in list(self.ready_listeners):
                listener(pod, sent, None)
            self.core.patch_namespaced_pod_status(name, namespace, {
                "metadata": {"uid": meta["uid"]},
                "status": {"phase": "Running", "conditions": conditions, "podIP": "127.0.0.1",
                           "podIPs": [{"ip": "127.0.0.1"}], "hostIP": "127.0.0.1", "startTime": stamp,
                           "containerStatuses": statuses},
            }, _content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status not in (404, 409, 422):  # gone or replaced meanwhile: nothing to do
                raise
            return
        accepted = time.time()
        for listener in list(self.ready_listeners):
            listener(pod, sent, accepted)

    def _finish(self, meta: Dict[str, Any]) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])),
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise


def _ready(pod: Dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])
