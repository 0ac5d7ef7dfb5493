"""Scaler-service backend: detection lag and request count against the reference client's polling.

Both clients run against the scaler test server (``tests/servers/scaler_server.py``)
with pod-ready (and head-recreate) delays chosen per trial, so the moment the
last worker appears, or the new head is Ready, is known exactly
(:class:`benchmarks.servers.TimedScalerServer`). Lag = the client's return
minus that moment. Request cost = requests the server received during one
long wait (60 s in the full run), backend vs baseline, run concurrently with
the lag trials. A third client, the backend with the poll schedule it shipped
before (:mod:`benchmarks.schedules`), shows what the schedule change bought.

The backend is measured as users get it: ``ScalerServiceBackend`` with its
default poll schedule.
"""
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

from benchmarks.lanes import deal, delays, pairs, run_lanes
from benchmarks.report import BenchResult, Target
from benchmarks.schedules import PREVIOUS_SCHEDULE
from benchmarks.stats import ratio, summarize

NAME = "scaler_lag"
TITLE = "Scaler backend: detection lag and requests vs fixed 2 s / 3 s polling"
PLOT = "scaler_lag.png"
CLUSTER = "ray-bench"
PLURAL = "rayclusters"
LAG_LIMIT_S = 1.0
CLIENTS = ("backend", "baseline", "previous")
"""The shipped backend, the reference strategy, and the backend with its previous schedule."""


@dataclass(frozen=True)
class Plan:
    """How much to measure."""

    scale_trials: int
    restart_trials: int
    scale_delay: Tuple[float, float]
    """Range of pod-ready delays (s) for the lag trials."""
    restart_delay: Tuple[float, float]
    """Range of head recreate+ready delays (s)."""
    long_wait: float
    lanes: int
    workers: int = 4


QUICK = Plan(scale_trials=1, restart_trials=1, scale_delay=(0.5, 0.5), restart_delay=(0.5, 0.5), long_wait=3.0, lanes=3)
FULL = Plan(scale_trials=20, restart_trials=14, scale_delay=(0.5, 10.0), restart_delay=(0.5, 10.0), long_wait=60.0, lanes=8)


@dataclass
class Trial:
    """One measured wait."""

    client: str
    operation: str
    delay: float
    lag: float
    requests: int
    long_wait: bool = False
    """True for the long request-count wait (kept out of the lag statistics)."""


class _Lane:
    """One server with one cluster, and the three clients on it."""

    def __init__(self, state_dir: Path) -> None:
        from benchmarks.baseline_client import ScalerPollingBaseline
        from benchmarks.servers import TimedScalerServer
        from flytekitplugins_ddlscale.backends.scaler import ScalerOptions, ScalerServiceBackend
        from tests.servers.scaler_server import DEFAULT_API_KEY

        self.server = TimedScalerServer().start()
        try:
            self.server.add_cluster("ray", CLUSTER, replicas=1, max_replicas=8, min_replicas=1, pod_ready_delay=0.0)
            url = self.server.url
            self.backend = ScalerServiceBackend(url, api_key=DEFAULT_API_KEY, state_dir=state_dir)
            self.baseline = ScalerPollingBaseline(url, DEFAULT_API_KEY, give_up_after=600.0)
            self.previous = {
                op: ScalerServiceBackend(
                    url, api_key=DEFAULT_API_KEY, state_dir=state_dir, options=ScalerOptions(poll_backoff=schedule)
                )
                for op, schedule in (("scale", PREVIOUS_SCHEDULE), ("restart", PREVIOUS_SCHEDULE))
            }
        except BaseException:
            self.server.stop()
            raise

    def close(self) -> None:
        self.backend.close()
        for backend in self.previous.values():
            backend.close()
        self.baseline.close()
        self.server.stop()

    def scale(self, client: str, replicas: int, delay: float) -> Trial:
        from flytekitplugins_ddlscale import ClusterRef

        self.server.set_pod_ready_delay(delay, "ray", CLUSTER)
        self.server.clear_requests()
        if client != "baseline":
            backend = self.backend if client == "backend" else self.previous["scale"]
            backend.scale(ClusterRef("ray", CLUSTER), replicas, wait=True, timeout=600)
            returned = time.time()
        else:
            returned = self.baseline.scale_and_wait(PLURAL, CLUSTER, replicas).returned_at
        lag = returned - self.server.ready_moment("scale", CLUSTER)
        return Trial(client, "scale", delay, lag, len(self.server.requests))

    def restart(self, client: str, delay: float) -> Trial:
        from flytekitplugins_ddlscale import ClusterRef

        # Half the delay is the pod being recreated (404 from the status route), half starting up.
        self.server.head_recreate_delay = delay / 2.0
        self.server.head_ready_delay = delay / 2.0
        self.server.clear_requests()
        if client != "baseline":
            backend = self.backend if client == "backend" else self.previous["restart"]
            backend.restart_head(ClusterRef("ray", CLUSTER), wait=True, timeout=600)
            returned = time.time()
        else:
            returned = self.baseline.restart_and_wait(PLURAL, CLUSTER).returned_at
        lag = returned - self.server.ready_moment("restart", CLUSTER)
        return Trial(client, "restart", delay, lag, len(self.server.requests))

    def reset(self) -> None:
        """Back to one worker at once (not measured)."""
        from flytekitplugins_ddlscale import ClusterRef

        self.server.set_pod_ready_delay(0.0, "ray", CLUSTER)
        self.backend.scale(ClusterRef("ray", CLUSTER), 1, wait=True, timeout=60)


Job = Tuple[str, str, float, bool]
"""(operation, client, delay, long wait)."""


def _lane(jobs: List[Job], workers: int, root: Path, index: int) -> Callable[[], List[Trial]]:
    def work() -> List[Trial]:
        lane = _Lane(root / f"lane-{index}")
        try:
            trials = []
            for operation, client, delay, long_wait in jobs:
                if operation == "scale":
                    trial = lane.scale(client, workers, delay)
                    lane.reset()
                else:
                    trial = lane.restart(client, delay)
                trial.long_wait = long_wait
                trials.append(trial)
            return trials
        finally:
            lane.close()

    return work


def _stats(trials: List[Trial], client: str, operation: str) -> Dict[str, Any]:
    mine = [t for t in trials if t.client == client and t.operation == operation and not t.long_wait]
    return {
        "lag_s": summarize([t.lag for t in mine], 4),
        "requests_per_wait": summarize([float(t.requests) for t in mine], 1),
    }


def plot(trials: List[Trial], path: Path) -> bool:
    """Lag against ready delay, backend vs baseline, for both operations; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, operation in zip(axes, ("scale", "restart")):
        for client, color, marker, label in (
            ("backend", "tab:blue", "o", "ScalerServiceBackend (shipped schedule)"),
            ("baseline", "tab:orange", "x", "reference: fixed 2 s / 3 s polling"),
            ("previous", "tab:green", "^", "backend with its previous schedule"),
        ):
            mine = sorted((t for t in trials if t.client == client and t.operation == operation), key=lambda t: t.delay)
            ax.plot([t.delay for t in mine], [t.lag for t in mine], color=color, marker=marker, linestyle="none",
                    label=label)
        ax.axhline(LAG_LIMIT_S, color="gray", linestyle=":", label="target p95 1 s")
        ax.set_xlabel("pod-ready delay (s)" if operation == "scale" else "head recreate + ready delay (s)")
        ax.set_title(f"{operation}: return - ready moment")
    axes[0].set_ylabel("detection lag (s)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def measure(plan: Plan) -> List[Trial]:
    """Run the lag trials and the long waits concurrently; return every trial."""
    scale_jobs: List[Job] = [
        ("scale", c, d, False) for c, d in pairs(delays(plan.scale_trials, *plan.scale_delay, seed=1), CLIENTS)
    ]
    restart_jobs: List[Job] = [
        ("restart", c, d, False) for c, d in pairs(delays(plan.restart_trials, *plan.restart_delay, seed=2), CLIENTS)
    ]
    with tempfile.TemporaryDirectory(prefix="ddlscale-bench-") as tmp:
        root = Path(tmp)
        lanes = [_lane(jobs, plan.workers, root, i) for i, jobs in enumerate(deal(scale_jobs + restart_jobs, plan.lanes))]
        long_jobs = [[(op, c, plan.long_wait, True)] for op in ("scale", "restart") for c in CLIENTS]
        lanes += [_lane(jobs, plan.workers, root, 100 + i) for i, jobs in enumerate(long_jobs)]
        return run_lanes(lanes)


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Measure scale and restart lag and the long-wait request counts for every client."""
    try:
        import flytekitplugins_ddlscale.backends.scaler  # noqa: F401
        import tests.servers.scaler_server  # noqa: F401
    except ImportError as exc:
        return BenchResult.skipped(NAME, TITLE, f"scaler backend or its test server not importable: {exc}")
    plan = QUICK if quick else FULL
    trials = measure(plan)
    lag_trials = [t for t in trials if not t.long_wait]
    long = {(t.client, t.operation): t for t in trials if t.long_wait}
    result = BenchResult(NAME, TITLE)
    metrics: Dict[str, Any] = {
        "plan": {
            "scale": f"1 -> {plan.workers} workers, {plan.scale_trials} trials per client, pod-ready delays "
            f"spread over {plan.scale_delay[0]}-{plan.scale_delay[1]} s",
            "restart": f"{plan.restart_trials} trials per client, head recreate+ready delays spread over "
            f"{plan.restart_delay[0]}-{plan.restart_delay[1]} s",
            "long_wait_s": plan.long_wait,
            "lanes": plan.lanes,
        },
    }
    for operation in ("scale", "restart"):
        per = {client: _stats(lag_trials, client, operation) for client in CLIENTS}
        backend, baseline = per["backend"], per["baseline"]
        per["ratio_to_baseline"] = {
            "median_lag": ratio(backend["lag_s"]["median"], baseline["lag_s"]["median"]),
            "p95_lag": ratio(backend["lag_s"]["p95"], baseline["lag_s"]["p95"]),
            "median_requests": ratio(backend["requests_per_wait"]["median"], baseline["requests_per_wait"]["median"]),
        }
        per["long_wait"] = {
            "seconds": plan.long_wait,
            **{f"{c}_requests": long[(c, operation)].requests for c in CLIENTS},
            **{f"{c}_lag_s": round(long[(c, operation)].lag, 4) for c in CLIENTS},
        }
        long_backend, long_baseline = long[("backend", operation)], long[("baseline", operation)]
        metrics[operation] = per
        result.targets.append(
            Target(f"{operation}: detection lag p95", backend["lag_s"]["p95"], LAG_LIMIT_S, "s",
                   detail=f"median {backend['lag_s']['median']} s; baseline p95 {baseline['lag_s']['p95']} s")
        )
        result.targets.append(
            Target(f"{operation}: requests over a {plan.long_wait:g} s wait (limit = baseline's)",
                   float(long_backend.requests), float(long_baseline.requests), "requests",
                   detail="all requests the server received for the operation, PATCH included")
        )
    metrics["trials"] = [
        {"client": t.client, "operation": t.operation, "delay_s": t.delay, "lag_s": round(t.lag, 4),
         "requests": t.requests, "long_wait": t.long_wait}
        for t in trials
    ]
    metrics["previous_schedule"] = {
        "scale_and_restart": repr(PREVIOUS_SCHEDULE),
        "note": "benchmarks/schedules.py: what the backend shipped before TwoStageBackoff, for comparison",
    }
    metrics["headline"] = [
        f"{op}: lag p95 shipped {metrics[op]['backend']['lag_s']['p95']} s / baseline "
        f"{metrics[op]['baseline']['lag_s']['p95']} s / previous schedule {metrics[op]['previous']['lag_s']['p95']} s; "
        f"requests in a {plan.long_wait:g} s wait {metrics[op]['long_wait']['backend_requests']} / "
        f"{metrics[op]['long_wait']['baseline_requests']} / {metrics[op]['long_wait']['previous_requests']}"
        for op in ("scale", "restart")
    ]
    result.metrics = metrics
    result.notes.append(
        "The scaler service shows pods, not readiness: 'ready' here is the moment the worker pod appears "
        "in status.nodes, which is all any client of the service can see."
    )
    result.notes.append(
        "'previous' is the backend with its previous poll schedule, "
        "benchmarks/schedules.py, measured in the same run for comparison."
    )
    if plot(lag_trials, out_dir / PLOT):
        result.files.append(PLOT)
    return result
