"""Outage ride-through: a scale wait while the scaler service or the Kubernetes API server is down.

Each trial puts the TCP fault proxy of the reliability suite
(``tests/reliability/rel_proxy.py``) between the backend and the test server,
starts ``scale(..., wait=True, timeout=30)`` and, once the wait is polling (scaler)
or watching (Kubernetes), refuses every connection and cuts the open ones for
4 s. The workers become Ready during the outage, so the moment the wait returns
minus the moment the proxy listens again is how long the backend took to notice
that the outage was over. One more trial per backend keeps the proxy down past
a 5 s timeout and records what the caller gets and how far past the timeout.
"""
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from benchmarks.report import BenchResult, Target
from benchmarks.stats import summarize

NAME = "outage"
TITLE = "Waits riding out a 4 s outage of the scaler service / Kubernetes API server"
OUTAGE = 4.0
TIMEOUT = 30.0
SHORT_TIMEOUT = 5.0


class _OutageLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.down = 0
        self.up = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.down += " is unreachable " in message
        self.up += " is reachable again " in message


def _proxy_for(url: str) -> Any:
    from tests.reliability.rel_proxy import FaultProxy

    host, port = url.rsplit("//", 1)[1].split(":")
    return FaultProxy((host, int(port)))


def _scaler_trial(long_outage: bool) -> Dict[str, Any]:
    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend
    from tests.servers.scaler_server import DEFAULT_API_KEY, ScalerTestServer

    ref = ClusterRef("ray", "ray-outage")
    with ScalerTestServer() as server, _proxy_for(server.url) as proxy, tempfile.TemporaryDirectory() as tmp:
        server.add_cluster("ray", ref.name, replicas=1, max_replicas=6)
        server.set_pod_ready_delay(60.0 if long_outage else 1.0)
        backend = ScalerServiceBackend(proxy.url, api_key=DEFAULT_API_KEY, state_dir=tmp)
        polling = lambda: any(r.method == "PATCH" for r in server.requests) and any(  # noqa: E731
            r.method == "GET" and "/cluster/" in r.path for r in server.requests[-3:]
        )
        try:
            return _trial(lambda timeout: backend.scale(ref, 4, wait=True, timeout=timeout), polling, proxy, long_outage)
        finally:
            backend.close()


def _k8s_trial(long_outage: bool) -> Dict[str, Any]:
    from kubernetes import client as k8s_client

    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
    from tests.servers.k8s_server import K8sTestServer

    ref = ClusterRef("ray", "ray-outage")
    with K8sTestServer(ready_delay=1.0) as server, _proxy_for(server.url) as proxy:
        server.add_cluster("ray", ref.name, replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 6})
        server.set_ready_delay(60.0 if long_outage else 1.0)
        api = k8s_client.ApiClient(k8s_client.Configuration(host=proxy.url))
        backend = KubernetesBackend(api_client=api)
        watching = lambda: any(r.query.get("watch") == "true" for r in server.requests)  # noqa: E731
        try:
            return _trial(lambda timeout: backend.scale(ref, 4, wait=True, timeout=timeout), watching, proxy, long_outage)
        finally:
            backend.close()
            api.close()


def _trial(scale: Callable[[float], Any], waiting: Callable[[], bool], proxy: Any, long_outage: bool) -> Dict[str, Any]:
    from tests.reliability.rel_helpers import When

    log = _OutageLog()
    plugin_log = logging.getLogger("flytekitplugins_ddlscale")
    plugin_log.addHandler(log)
    fault = (lambda: proxy.go_down()) if long_outage else (lambda: proxy.outage(OUTAGE))
    timeout = SHORT_TIMEOUT if long_outage else TIMEOUT
    started = time.monotonic()
    try:
        with When(waiting, fault):
            try:
                scale(timeout)
                outcome = "completed"
            except Exception as exc:  # noqa: BLE001 - the outcome is what is measured
                outcome = f"{type(exc).__name__}: {exc}"
        ended = time.monotonic()
    finally:
        plugin_log.removeHandler(log)
    trial: Dict[str, Any] = {"outcome": outcome, "logged_down": log.down, "logged_up": log.up}
    if long_outage:
        trial["past_timeout_s"] = round(ended - started - timeout, 3)
    elif proxy.up_at is not None:
        trial["returned_after_back_s"] = round(ended - proxy.up_at, 3)
    return trial


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """``1`` (quick) or ``5`` ride-through trials per backend, plus one outage longer than the timeout each."""
    try:
        import kubernetes  # noqa: F401
    except ImportError as exc:
        return BenchResult.skipped(NAME, TITLE, f"kubernetes client not importable: {exc}")
    trials = 1 if quick else 5
    result = BenchResult(NAME, TITLE)
    headline: List[str] = []
    for backend, trial in (("scaler", _scaler_trial), ("kubernetes", _k8s_trial)):
        rides: List[Dict[str, Any]] = [trial(False) for _ in range(trials)]
        beyond = trial(True)
        lags = [t["returned_after_back_s"] for t in rides if t["outcome"] == "completed"]
        completed = len(lags)
        logged_once = sum(1 for t in rides if (t["logged_down"], t["logged_up"]) == (1, 1))
        stats = summarize(lags, 3) if lags else {}
        result.metrics[backend] = {"trials": rides, "outage_past_timeout": beyond, "returned_after_back_s": stats}
        result.targets.append(Target(f"{backend}: {OUTAGE:g} s outage in a {TIMEOUT:g} s wait, waits completed",
                                     completed, trials, "trials", ">="))
        result.targets.append(Target(f"{backend}: outages logged exactly once (down + up)", logged_once, trials,
                                     "trials", ">="))
        if lags:
            result.targets.append(Target(
                f"{backend}: wait returned after the server came back (p95)", stats["p95"], 2.5, "s",
                detail=f"median {stats['median']} s; backoff during an outage 0.2 s doubling to 2 s, jittered",
            ))
            headline.append(f"{backend}: {completed}/{trials} waits rode out a {OUTAGE:g} s outage; returned "
                            f"{stats['median']:.2f} s (median, max {stats['max']:.2f} s) after the server came back")
        error = beyond["outcome"].split(":", 1)[0]
        names = "names the outage" if "was unreachable for" in beyond["outcome"] else "does NOT name the outage"
        headline.append(f"{backend}: server down past a {SHORT_TIMEOUT:g} s timeout -> {error} "
                        f"{beyond.get('past_timeout_s')} s after the timeout; the message {names}")
    result.metrics["headline"] = headline
    result.notes.append("The outage is a TCP proxy refusing and cutting connections (a restarting server).")
    return result
