"""Framework readiness: premature returns and detection lag when workers join after their pods.

On the scaler test server the pods of a 0 -> 4 scale appear after a short
pod delay; each worker then joins the framework (a Ray dashboard test
server, ``tests/servers/ray_dashboard.py``) 0.5-10 s after its pod, the last
one exactly ``join_delay`` s after. Three clients per trial, on the same
servers with the same delays:

* ``framework``: what ``ScaleCluster``/``ddlscale scale --wait`` do: the
  scaler backend's scale and wait, then :class:`ReadinessCheck` against the head;
* ``pods_only``: the same backend with the framework check off (what the
  plugin did before);
* ``baseline``: the reference client's strategy (fixed 2 s polling of the
  service, :mod:`benchmarks.baseline_client`).

A return before the last worker joined is premature; detection lag is the
return minus the last join (same clock: ``time.monotonic()``, same process).
"""
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

from benchmarks.lanes import deal, delays, pairs, run_lanes
from benchmarks.report import BenchResult, Target
from benchmarks.stats import summarize

NAME = "readiness_lag"
TITLE = "Framework readiness: premature returns and lag after the last worker joined, vs pod polling"
CLUSTER = "ray-ready"
PLURAL = "rayclusters"
WORKERS = 4
POD_DELAY = 0.3
LAG_LIMIT_S = 0.5
CLIENTS = ("framework", "pods_only", "baseline")


@dataclass(frozen=True)
class Plan:
    trials: int
    join_delay: Tuple[float, float]
    lanes: int


QUICK = Plan(trials=2, join_delay=(0.5, 10.0), lanes=3)
FULL = Plan(trials=12, join_delay=(0.5, 10.0), lanes=6)


@dataclass
class Trial:
    client: str
    join_delay: float
    returned_after_last_join: float
    """Return minus the last worker's join, in seconds (negative: premature)."""
    workers_at_return: int

    @property
    def premature(self) -> bool:
        return self.returned_after_last_join < 0


class _Lane:
    """One scaler test server and one Ray head, with the three clients."""

    def __init__(self, state_dir: Path) -> None:
        from benchmarks.baseline_client import ScalerPollingBaseline
        from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend
        from tests.servers.ray_dashboard import RayDashboardServer
        from tests.servers.scaler_server import DEFAULT_API_KEY, ScalerTestServer

        self.server = ScalerTestServer().start()
        self.head = RayDashboardServer().start()
        try:
            self.server.add_cluster("ray", CLUSTER, replicas=0, max_replicas=8, min_replicas=None)
            self.backend = ScalerServiceBackend(self.server.url, api_key=DEFAULT_API_KEY, state_dir=state_dir, env={})
            self.baseline = ScalerPollingBaseline(self.server.url, DEFAULT_API_KEY, give_up_after=600.0)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for closer in ("backend", "baseline"):
            if hasattr(self, closer):
                getattr(self, closer).close()
        self.head.stop()
        self.server.stop()

    def trial(self, client: str, join_delay: float) -> Trial:
        from flytekitplugins_ddlscale import ClusterRef
        from flytekitplugins_ddlscale._services.readiness import FrameworkOptions, ReadinessCheck

        ref = ClusterRef("ray", CLUSTER)
        self.server.set_pod_ready_delay(POD_DELAY, "ray", CLUSTER)
        pods_at = time.monotonic() + POD_DELAY
        joins = [pods_at + 0.5 + (join_delay - 0.5) * (i + 1) / WORKERS for i in range(WORKERS)]
        self.head.join_at(joins)
        if client == "baseline":
            self.baseline.scale_and_wait(PLURAL, CLUSTER, WORKERS)
        else:
            result = self.backend.scale(ref, WORKERS, wait=True, timeout=600)
            options = FrameworkOptions(enabled=client == "framework", url=self.head.url, env={})
            ReadinessCheck(self.backend, ref, options).ready(result.final, result.effective, 600)
        returned = time.monotonic()
        return Trial(client, join_delay, returned - max(joins), self.head.alive_count())

    def reset(self) -> None:
        from flytekitplugins_ddlscale import ClusterRef

        self.server.set_pod_ready_delay(0.0, "ray", CLUSTER)
        self.head.join_at([])
        self.backend.scale(ClusterRef("ray", CLUSTER), 0, wait=True, timeout=60)


def _lane(jobs: List[Tuple[str, float]], root: Path, index: int) -> Callable[[], List[Trial]]:
    def work() -> List[Trial]:
        lane = _Lane(root / f"lane-{index}")
        try:
            trials = []
            for client, delay in jobs:
                trials.append(lane.trial(client, delay))
                lane.reset()
            return trials
        finally:
            lane.close()

    return work


def measure(plan: Plan) -> List[Trial]:
    """Every client on every join delay, spread over parallel lanes."""
    jobs = pairs(delays(plan.trials, *plan.join_delay, seed=3), CLIENTS)
    with tempfile.TemporaryDirectory(prefix="ddlscale-bench-") as tmp:
        root = Path(tmp)
        return run_lanes([_lane(lane_jobs, root, i) for i, lane_jobs in enumerate(deal(jobs, plan.lanes))])


def _client_stats(trials: List[Trial], client: str) -> Dict[str, Any]:
    mine = [t for t in trials if t.client == client]
    late = [t.returned_after_last_join for t in mine if not t.premature]
    early = [-t.returned_after_last_join for t in mine if t.premature]
    return {
        "trials": len(mine),
        "premature_returns": len(early),
        "lag_after_last_join_s": summarize(late, 4) if late else None,
        "premature_by_s": summarize(early, 4) if early else None,
        "workers_registered_at_return": summarize([float(t.workers_at_return) for t in mine], 1),
    }


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Measure premature returns and detection lag for the three clients."""
    try:
        import flytekitplugins_ddlscale.backends.scaler  # noqa: F401
        import tests.servers.ray_dashboard  # noqa: F401
    except ImportError as exc:
        return BenchResult.skipped(NAME, TITLE, f"scaler backend or the test servers not importable: {exc}")
    plan = QUICK if quick else FULL
    trials = measure(plan)
    per = {client: _client_stats(trials, client) for client in CLIENTS}
    framework = per["framework"]
    lag = framework["lag_after_last_join_s"]
    result = BenchResult(NAME, TITLE)
    result.metrics = {
        "plan": {
            "scale": f"0 -> {WORKERS} workers; pods appear after {POD_DELAY} s; workers join the framework "
            f"0.5 s to join_delay after their pods, join_delay spread over {plan.join_delay[0]}-{plan.join_delay[1]} s",
            "trials_per_client": plan.trials,
            "lanes": plan.lanes,
        },
        **per,
        "trials": [
            {"client": t.client, "join_delay_s": t.join_delay, "returned_after_last_join_s": round(t.returned_after_last_join, 4),
             "workers_at_return": t.workers_at_return}
            for t in trials
        ],
    }
    result.targets.append(
        Target("premature returns (framework check on)", float(framework["premature_returns"]), 0.0, "returns",
               detail=f"of {framework['trials']}; pods only {per['pods_only']['premature_returns']}, "
               f"baseline {per['baseline']['premature_returns']}")
    )
    result.targets.append(
        Target("detection lag p95 after the last worker joined", lag["p95"] if lag else None, LAG_LIMIT_S, "s",
               detail=(f"median {lag['median']} s" if lag else "no non-premature return")
               + (f"; baseline premature by median {per['baseline']['premature_by_s']['median']} s"
                  if per["baseline"]["premature_by_s"] else ""))
    )
    result.notes.append(
        "Premature: the client returned before the last worker had registered with the framework, i.e. "
        "it reported workers that could not yet run anything. Pods-only clients cannot do better than pods."
    )
    return result
