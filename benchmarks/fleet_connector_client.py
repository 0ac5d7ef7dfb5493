"""Child process of the fleet benchmark: one connector answering many executions' polls at once.

Run as ``python -m benchmarks.fleet_connector_client KUBECONFIG COUNT REPLICAS POLL_S``. It
warms up as a running connector service is warm (modules imported, one ``get`` answered), prints
``warm``, and keeps polling one execution every ``POLL_S`` seconds while the parent sends the scale
requests of clusters ``c000``... (a service in the field answers polls all the time, so its caches do
not lapse between executions). On a first line on stdin (the scales are sent) it stops that poll,
prints ``quiet`` once its last poll returned (so the parent counts none of its requests), and waits
for a second line. Then it polls :meth:`ScalingConnector.get` for one ``ddlscale_wait`` execution per
cluster, each every ``POLL_S`` seconds, the way flytekit's connector service calls a connector: one
asyncio event loop restores each poll's metadata from bytes and awaits ``mirror_async_methods(
connector.get, ...)``: a coroutine ``get`` is awaited on the loop, a synchronous one (the plugin's
before it was made a coroutine) runs on the loop's default thread pool (``min(32, CPUs + 4)``
threads), as in the service. The executions are 1,000 coroutines, not 1,000 threads of this process
(no service runs one per node). When every execution has made its first poll it prints ``first`` and the
time, so the parent can count the requests of the polls after the first; at the end one JSON
document: per execution, when each poll started and returned, what it answered and the CPU time it
took (the loop's thread, and this whole process, meanwhile: a poll whose wall time far exceeds both
waited for a core, not for this process) and whether it waited (handed to a thread; 0: answered on
the loop itself at its first step), why polls were handed to a thread (the connector's debug log), this
process's peak RSS, its garbage collector's pauses
while polling, and the connections its Kubernetes API clients opened (each a TCP and, on https, a
TLS handshake). The previous design's run uses this same harness on the previous plugin code.

Where the design keeps a shared pod cache, the document also says, per cluster, when that cache first
held all ``REPLICAS`` of its workers Ready (``cached``): a subscriber of the connector's own pod
informer notes it, so the parent can split an answer's lag into the server's part (write accepted to
the event in the cache) and the client's (cache to answer). The note is taken in the informer's thread
as it hands the change to a subscription of that cluster's workers (one per cluster, as a wait has).
The server's part can be below zero: the watch may deliver the event before the writer has the answer
to its write.
"""
import asyncio
import gc
import json
import logging
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from benchmarks.k8s_scale_client import NAMESPACE, cluster_name, peak_rss_kb

WAIT_TASK_TYPE = "ddlscale_wait"
"""The wait node's task type: a protocol name both designs serve (the module naming it moved between them)."""


def connections_opened() -> Optional[int]:
    """New connections this process's Kubernetes API clients opened (urllib3 counts them per pool): the
    connector's kept backends and the shared informers' own clients; None where this design has neither."""
    clients: List[Any] = []
    try:
        from flytekitplugins_ddlscale.connector import POLL_BACKENDS
    except ImportError:  # the previous design kept no backends
        return None
    for kept in list(getattr(POLL_BACKENDS, "_kept", {}).values()):
        api = getattr(kept.backend, "_api", None)
        if api is not None:
            clients.append(api.api_client)
    try:
        from flytekitplugins_ddlscale.backends.kubernetes._informer import running_informers

        try:
            informers = running_informers(None)
        except TypeError:  # a design whose informers are the pods' only
            informers = running_informers()
        clients.extend(informer.api.api_client for informer in informers)
    except (ImportError, AttributeError):  # a design without shared informers, or of another shape
        pass
    opened = 0
    for api_client in clients:
        pools = api_client.rest_client.pool_manager.pools
        for key in list(pools.keys()):
            pool = pools.get(key)
            opened += getattr(pool, "num_connections", 0) if pool is not None else 0
    return opened


class _ReadyNote(threading.Event):
    """The wake-up of one cluster's subscription to the shared pod cache: notes when the cache first
    holds ``replicas`` of its workers Ready. The informer sets it in its own thread right after it
    changed the subscription's pods, so reading them here needs no lock and costs a few pods' check."""

    def __init__(self, cluster: str, replicas: int, noted: Dict[str, float], ready: Any) -> None:
        super().__init__()
        self.cluster, self.replicas, self.noted, self.ready = cluster, replicas, noted, ready
        self.sub: Any = None

    def set(self) -> None:
        super().set()
        if self.sub is None or self.cluster in self.noted:
            return
        if sum(1 for pod in list(self.sub.pods.values()) if self.ready(pod)) >= self.replicas:
            self.noted[self.cluster] = time.time()


class CacheObserver:
    """Notes when the connector's shared pod cache first holds ``replicas`` Ready workers of each cluster
    (one subscription per cluster on its labels, as a wait's; nothing scans the cache)."""

    def __init__(self, clusters: List[str], replicas: int) -> None:
        from flytekitplugins_ddlscale.backends.kubernetes._informer import running_informers
        from flytekitplugins_ddlscale.backends.kubernetes._spec import pod_ready

        (pods,) = running_informers()
        self.cached: Dict[str, float] = {}
        """Cluster name -> when the cache first held all its workers Ready (time.time())."""
        self._subs = []
        for cluster in clusters:
            note = _ReadyNote(cluster, replicas, self.cached, pod_ready)
            note.sub = pods.subscribe(f"app.kubernetes.io/instance={cluster},app.kubernetes.io/component=worker", note)
            self._subs.append(note.sub)

    def close(self) -> None:
        for sub in self._subs:
            sub.close()


class Stepped:
    """Awaits ``call`` (a coroutine) and notes whether it suspended: False when it finished on its first
    step, i.e. the poll was answered on the loop itself, with no thread and no wait."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.suspended = False

    def __await__(self) -> Any:
        steps = self.call.__await__()
        try:
            pending = steps.send(None)
        except StopIteration as done:
            return done.value
        self.suspended = True
        while True:
            try:
                yield pending
            except BaseException as error:  # a cancellation, handed to the call
                try:
                    pending = steps.throw(error)
                except StopIteration as done:
                    return done.value
                continue
            try:
                pending = steps.send(None)
            except StopIteration as done:
                return done.value


class CacheMisses(logging.Handler):
    """Why polls were handed to a reader thread, counted from the connector's debug log while it is open."""

    MARK = "waits for a reader thread ("

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: Dict[str, int] = {}
        self._logger = logging.getLogger("flytekitplugins_ddlscale.connector")
        self._level = self._logger.level
        self._logger.addHandler(self)
        self._logger.setLevel(logging.DEBUG)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.MARK in message:
            reason = message.split(self.MARK, 1)[1].rstrip(")")
            # One count per kind of reason: cluster and namespace names are left out.
            reason = " ".join(word for word in reason.split() if not any(ch.isdigit() for ch in word))
            self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def close(self) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)
        super().close()


class GcPauses:
    """The garbage collector's pauses in this process while it is open: [generation, milliseconds] each
    (every thread stops for them, the event loop answering polls included)."""

    def __init__(self) -> None:
        self.pauses: List[List[float]] = []
        self._began = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append([info["generation"], (time.perf_counter() - self._began) * 1000.0])

    def close(self) -> None:
        gc.callbacks.remove(self._note)


def observe_cache(clusters: List[str], replicas: int) -> Optional[CacheObserver]:
    """A :class:`CacheObserver` on the connector's pod cache, or None in a design without one of this shape."""
    try:
        return CacheObserver(clusters, replicas)
    except (ImportError, AttributeError, TypeError, ValueError):
        return None


def main(kubeconfig: str, count: int, replicas: int, poll: float, limit: float = 300.0) -> Dict[str, Any]:
    """Poll every execution until it leaves RUNNING; return per-execution polls, errors and peak RSS."""
    os.environ["KUBECONFIG"] = kubeconfig
    os.environ["DDLSCALE_BACKEND"] = "kubernetes"
    from flyteidl.core.execution_pb2 import TaskExecution
    from flytekit.extend.backend.utils import mirror_async_methods

    from flytekitplugins_ddlscale.connector import ScalingConnector, ScalingMetadata

    connector = ScalingConnector(WAIT_TASK_TYPE)

    def meta_of(name: str) -> bytes:
        now = time.time()
        return ScalingMetadata(
            task_type=WAIT_TASK_TYPE, cluster=f"{NAMESPACE}/ray/{name}", backend="kubernetes", target=replicas,
            started=now, deadline=now + limit, outcome=json.dumps({"backend": "kubernetes"}), framework_ready=False,
        ).encode()

    async def warm_up() -> None:  # as the service calls it, whichever design ``get`` has
        await mirror_async_methods(connector.get, resource_meta=ScalingMetadata.decode(meta_of(cluster_name(0))))

    async def keep_warm() -> None:
        """Poll one execution every ``poll`` seconds until the parent's line arrives."""
        sent = asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        meta = meta_of(cluster_name(0))
        while not sent.done():
            await mirror_async_methods(connector.get, resource_meta=ScalingMetadata.decode(meta))
            await asyncio.wait([sent], timeout=poll)

    asyncio.run(warm_up())
    observer = observe_cache([cluster_name(i) for i in range(count)], replicas)
    rss_before_kb = peak_rss_kb()
    print("warm", flush=True)
    asyncio.run(keep_warm())
    print("quiet", flush=True)
    sys.stdin.readline()
    pauses, misses = GcPauses(), CacheMisses()

    firsts = [0]

    def first_poll_made() -> None:
        firsts[0] += 1
        if firsts[0] == count:
            print(f"first {time.time()}", flush=True)

    async def one(index: int) -> Dict[str, Any]:
        name = cluster_name(index)
        meta = meta_of(name)
        polls: List[List[float]] = []
        await asyncio.sleep(poll * index / count)  # executions started at different moments, as in a fleet
        while True:
            began, loop_cpu, process_cpu = time.time(), time.thread_time(), time.process_time()
            call = mirror_async_methods(connector.get, resource_meta=ScalingMetadata.decode(meta))
            stepped = Stepped(call) if asyncio.iscoroutine(call) else None
            try:
                resource = await (stepped if stepped is not None else call)
            except Exception as exc:  # reported per execution; the parent counts failures
                if not polls:
                    first_poll_made()
                return {"cluster": name, "polls": polls, "error": repr(exc)}
            done = resource.phase != TaskExecution.RUNNING
            polls.append([began, time.time(), float(done), (time.thread_time() - loop_cpu) * 1000.0,
                          (time.process_time() - process_cpu) * 1000.0,
                          float(stepped is None or stepped.suspended)])
            if len(polls) == 1:
                first_poll_made()
            if done:
                ok = resource.phase == TaskExecution.SUCCEEDED
                return {"cluster": name, "polls": polls, "error": None if ok else resource.message}
            await asyncio.sleep(max(0.0, poll - (time.time() - began)))

    async def every_execution() -> List[Dict[str, Any]]:
        return list(await asyncio.gather(*(one(index) for index in range(count))))

    executions = asyncio.run(every_execution())
    pauses.close()
    misses.close()
    if observer is not None:
        observer.close()
        for execution in executions:
            execution["cached"] = observer.cached.get(execution["cluster"])
    return {"executions": executions, "rss_before_kb": rss_before_kb, "peak_rss_kb": peak_rss_kb(),
            "connections_opened": connections_opened(), "gc_pauses": pauses.pauses,
            "cache_misses": misses.reasons}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))))
