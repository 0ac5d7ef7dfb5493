"""Kubernetes backend: detection lag of watch-based waits and their request cost.

Against the Kubernetes test server (``tests/servers/k8s_server.py``) and its
simulated operator, which marks each new pod Ready after a delay chosen per
trial; :func:`benchmarks.servers.timed_k8s_server` records the moment each
pod is stored Ready. Lag = ``scale(..., wait=True)`` returning minus the last
new worker's Ready moment. The baseline is fixed 2 s polling of the worker
pods (:class:`benchmarks.baseline_client.K8sPollingBaseline`).

Request cost: every request the server received during one scale-and-wait,
for waits of 1 s, 5 s and 20 s (pod-ready delays), backend vs baseline. A
watch is one long request, so the backend's count should not grow with the
wait; the baseline's grows by one every 2 s.

The same backend is measured on a KubeRay RayCluster (``kuberay``) and a
Dask-operator cluster (``dask-operator``) of the test server's simulated
operators, as on Domino's RayCluster (``backend``); the baseline polls
Domino's RayCluster only.

``server="envtest"`` (benchmark ``k8s_lag_envtest``) measures the backend and
the baseline on Domino's RayCluster against a real kube-apiserver with etcd
(:mod:`benchmarks.real_k8s`; one namespace per lane on one control plane):
Ready moments are the fake kubelet's status writes, requests come from the
API server's audit log. No KubeRay or Dask operator runs there.
"""
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from benchmarks.lanes import deal, delays, pairs, run_lanes
from benchmarks.report import BenchResult, Target
from benchmarks.stats import ratio, summarize

NAME = "k8s_lag"
TITLE = "Kubernetes backend: watch detection lag and requests per wait vs 2 s polling"
PLOT = "k8s_requests.png"
SERVERS = {"test-server": NAME, "envtest": f"{NAME}_envtest"}
"""The servers to measure on, and the result name of each."""
TITLES = {"test-server": TITLE,
          "envtest": "Kubernetes backend on a real kube-apiserver and etcd: watch detection lag and requests per wait"}
LAG_LIMIT_S = 0.050
NAMESPACE = "domino-compute"
OWNER = "owner-1"
CLIENTS = ("backend", "baseline", "kuberay", "dask-operator")
REAL_CLIENTS = ("backend", "baseline")
"""Clients measured on the real API server: no KubeRay or Dask operator makes pods there."""
OPERATORS = ("kuberay", "dask-operator")
"""Clients that are the backend on an open-source operator's cluster of that kind."""


@dataclass(frozen=True)
class Plan:
    """How much to measure."""

    trials: int
    delay: Tuple[float, float]
    wait_lengths: Tuple[float, ...]
    lanes: int
    workers: int = 4


QUICK = Plan(trials=1, delay=(0.3, 0.3), wait_lengths=(0.3, 1.0), lanes=2)
FULL = Plan(trials=30, delay=(0.2, 5.0), wait_lengths=(1.0, 5.0, 20.0), lanes=6)


@dataclass
class Trial:
    """One measured scale-and-wait."""

    client: str
    delay: float
    lag: float
    requests: int
    count_only: bool = False
    """True for the wait-length request-count runs (kept out of the lag statistics)."""
    ready_write_ms: Optional[float] = None
    """Real API server: the longest round trip of the trial's Ready status writes (part of its lag)."""


class _Lane:
    """One server with one cluster per client: a test server of its own, or (``envtest``) a namespace of the
    running control plane, ``bench-lag-<index>``."""

    def __init__(self, index: int, clients: Tuple[str, ...], envtest: Any = None) -> None:
        from benchmarks.baseline_client import K8sPollingBaseline
        from benchmarks.servers import timed_k8s_server
        from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

        self.prefix = f"k{index}"
        """Cluster names differ between lanes: the real server's kubelet holds ready delays by cluster name."""
        if envtest is None:
            self.namespace = NAMESPACE
            self.server = timed_k8s_server(ready_delay=0.0).start()
            auth: Dict[str, str] = {}
        else:
            from benchmarks.real_k8s import RealK8sServer

            self.namespace = f"bench-lag-{index}"
            self.server = RealK8sServer(envtest, self.namespace)
            auth = self.server.http_auth
        try:
            for client in ("backend", "baseline"):
                self.server.add_cluster(
                    "ray", self.name(client), self.namespace, replicas=1,
                    autoscaling={"minReplicas": 1, "maxReplicas": 8}, owner=OWNER,
                )
            if "kuberay" in clients:
                self.server.add_kuberay(
                    self.name("kuberay"), self.namespace,
                    groups=[{"groupName": "workers", "replicas": 1, "maxReplicas": 8}], autoscaling=True,
                )
            if "dask-operator" in clients:
                self.server.add_dask_operator(self.name("dask-operator"), self.namespace, replicas=1)
            if envtest is not None:
                self.server.wait_up(2)
            self.backend = KubernetesBackend(self.namespace, api_client=self.server.api_client(), owner=OWNER)
            self.baseline = K8sPollingBaseline(self.server.url, give_up_after=600.0, **auth)
        except BaseException:
            self.server.close()
            raise

    def name(self, client: str) -> str:
        """The cluster of ``client`` in this lane."""
        return f"{self.prefix}-{client}"

    def close(self) -> None:
        self.backend.close()
        self.baseline.close()
        self.server.close()

    def _scale(self, client: str, replicas: int) -> float:
        from flytekitplugins_ddlscale import ClusterRef
        from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION

        name = self.name(client)
        if client == "backend" or client in OPERATORS:
            kind = client if client in OPERATORS else "ray"
            self.backend.scale(ClusterRef(kind, name, self.namespace), replicas, wait=True, timeout=600)
            return time.time()
        return self.baseline.scale_and_wait(
            CRD_GROUP, CRD_VERSION, self.namespace, "rayclusters", "ray", name, replicas).returned_at

    def trial(self, client: str, workers: int, delay: float, cold: bool = False) -> Trial:
        """One scale-and-wait to ``workers`` and back; ``cold``: first let the backend's pod informer stop
        (it lingers after a wait), so the requests counted are those of a wait that starts its own watch."""
        from flytekitplugins_ddlscale.backends.kubernetes._informer import WAIT_LINGER

        if cold:
            time.sleep(WAIT_LINGER + 0.5)
        name = self.name(client)
        self.server.set_ready_delay(delay, name)
        self.server.clear_log()
        began = time.time()
        returned = self._scale(client, workers)
        requests = len(self.server.requests)
        moments = self.server.ready_moments(name, "worker", since=began)
        if len(moments) < workers - 1:
            raise RuntimeError(f"{client}: expected {workers - 1} new Ready workers, the server saw {len(moments)}")
        trial = Trial(client, delay, returned - max(moments), requests)
        if hasattr(self.server, "ready_write_ms"):
            trial.ready_write_ms = max(self.server.ready_write_ms(since=began), default=None)
        self.server.set_ready_delay(0.0, name)
        self._scale(client, 1)
        return trial


Job = Tuple[str, float, bool]


def _lane(index: int, jobs: List[Job], workers: int, clients: Tuple[str, ...], envtest: Any) -> Callable[[], List[Trial]]:
    def work() -> List[Trial]:
        lane = _Lane(index, clients, envtest)
        try:
            out = []
            for client, delay, count_only in jobs:
                trial = lane.trial(client, workers, delay, cold=count_only)
                trial.count_only = count_only
                out.append(trial)
            return out
        finally:
            lane.close()

    return work


def measure(plan: Plan, clients: Tuple[str, ...] = CLIENTS, envtest: Any = None) -> List[Trial]:
    """Every trial of ``clients``, dealt over ``plan.lanes`` lanes (each starts its own server, which takes
    seconds, or its own namespace of the running control plane ``envtest``).

    The request-count waits go first, longest first, so they spread over the lanes.
    """
    count_jobs: List[Job] = [(c, length, True) for length in sorted(plan.wait_lengths, reverse=True) for c in clients]
    lag_jobs: List[Job] = [(c, d, False) for c, d in pairs(delays(plan.trials, *plan.delay, seed=3), clients)]
    dealt = deal(count_jobs + lag_jobs, plan.lanes)
    return run_lanes([_lane(i, jobs, plan.workers, clients, envtest) for i, jobs in enumerate(dealt)])


def plot(counts: Dict[str, Dict[str, int]], path: Path) -> bool:
    """Requests per wait against wait length, backend vs baseline; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for client, color, label in (("backend", "tab:blue", "KubernetesBackend (watch), Domino RayCluster"),
                                 ("kuberay", "tab:green", "KubernetesBackend (watch), KubeRay RayCluster"),
                                 ("dask-operator", "tab:purple", "KubernetesBackend (watch), Dask operator"),
                                 ("baseline", "tab:orange", "2 s polling baseline")):
        if client not in counts:
            continue
        xs = sorted(float(k) for k in counts[client])
        ax.plot(xs, [counts[client][f"{x:g}"] for x in xs], marker="o", color=color, label=label)
    ax.set_xlabel("wait length: pod-ready delay (s)")
    ax.set_ylabel("API requests for one scale-and-wait")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("Requests per wait")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results"), server: str = "test-server") -> BenchResult:
    """Measure watch lag and requests per wait for the Kubernetes backend and the polling baseline, on the
    test server or (``server="envtest"``) a real kube-apiserver (skipped, saying what to set, where it cannot start)."""
    if server not in SERVERS:
        raise ValueError(f"server must be one of {', '.join(SERVERS)}, not {server!r}")
    name, title = SERVERS[server], TITLES[server]
    try:
        import flytekitplugins_ddlscale.backends.kubernetes  # noqa: F401
        import tests.servers.k8s_server  # noqa: F401
    except ImportError as exc:
        return BenchResult.skipped(name, title, f"kubernetes backend or its test server not importable: {exc}")
    plan = QUICK if quick else FULL
    if server == "envtest":
        from benchmarks import real_k8s

        why = real_k8s.missing()
        if why:
            return BenchResult.skipped(name, title, why)
        clients: Tuple[str, ...] = REAL_CLIENTS
        with real_k8s.control_plane() as envtest:
            trials = measure(plan, clients, envtest)
    else:
        clients = CLIENTS
        trials = measure(plan, clients)
    lag = [t for t in trials if not t.count_only]
    counts: Dict[str, Dict[str, int]] = {c: {} for c in clients}
    for t in trials:
        if t.count_only:
            counts[t.client][f"{t.delay:g}"] = t.requests
    per: Dict[str, Any] = {}
    for client in clients:
        mine = [t for t in lag if t.client == client]
        per[client] = {
            "lag_s": summarize([t.lag for t in mine], 4),
            "requests_per_wait": summarize([float(t.requests) for t in mine], 1),
        }
        writes = [t.ready_write_ms for t in mine if t.ready_write_ms is not None]
        if writes:
            per[client]["ready_write_ms"] = summarize(writes, 1)
    backend_lag = per["backend"]["lag_s"]
    spread = max(counts["backend"].values()) - min(counts["backend"].values())
    operator_lines = [
        f"{kind}: watch lag median {per[kind]['lag_s']['median'] * 1000:.1f} ms, p95 "
        f"{per[kind]['lag_s']['p95'] * 1000:.1f} ms; requests per wait {counts[kind]}"
        for kind in OPERATORS if kind in clients
    ]
    result = BenchResult(name, title)
    result.metrics = {
        "plan": {
            "lag": f"1 -> {plan.workers} workers, {plan.trials} trials per client, pod-ready delays "
            f"spread over {plan.delay[0]}-{plan.delay[1]} s, {plan.lanes} lanes",
            "wait_lengths_s": list(plan.wait_lengths),
            "server": server,
        },
        **per,
        "ratio_to_baseline": {
            "median_lag": ratio(backend_lag["median"], per["baseline"]["lag_s"]["median"]),
            "p95_lag": ratio(backend_lag["p95"], per["baseline"]["lag_s"]["p95"]),
        },
        "requests_by_wait_length": counts,
        "trials": [
            {"client": t.client, "delay_s": t.delay, "lag_s": round(t.lag, 4), "requests": t.requests,
             "count_only": t.count_only, "ready_write_ms": t.ready_write_ms}
            for t in trials
        ],
        "headline": [
            f"watch lag median {backend_lag['median'] * 1000:.1f} ms, p95 {backend_lag['p95'] * 1000:.1f} ms "
            f"(polling baseline p95 {per['baseline']['lag_s']['p95'] * 1000:.0f} ms); requests per wait "
            f"{counts['backend']} vs baseline {counts['baseline']}",
            *operator_lines,
        ],
    }
    result.targets.append(
        Target("detection lag p95 (watch)", round(backend_lag["p95"] * 1000, 1), LAG_LIMIT_S * 1000, "ms",
               detail=f"median {backend_lag['median'] * 1000:.1f} ms over {backend_lag['n']} trials")
    )
    result.targets.append(
        Target("requests per wait: spread across wait lengths " + "/".join(f"{w:g}" for w in plan.wait_lengths) + " s",
               float(spread), 0.0, "requests",
               detail=f"backend {counts['backend']}, baseline {counts['baseline']}")
    )
    for kind in (k for k in OPERATORS if k in clients):
        lag_kind = per[kind]["lag_s"]
        result.targets.append(
            Target(f"detection lag p95 (watch), {kind}", round(lag_kind["p95"] * 1000, 1), LAG_LIMIT_S * 1000, "ms",
                   detail=f"median {lag_kind['median'] * 1000:.1f} ms over {lag_kind['n']} trials")
        )
        result.targets.append(
            Target(f"requests per wait: spread across wait lengths, {kind}",
                   float(max(counts[kind].values()) - min(counts[kind].values())), 0.0, "requests",
                   detail=f"{kind} {counts[kind]}")
        )
    plot_file = PLOT if server == "test-server" else PLOT.replace(".png", f"_{server}.png")
    if plot(counts, out_dir / plot_file):
        result.files.append(plot_file)
    return result
