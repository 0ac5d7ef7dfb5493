"""Fleet scale on the scaler service: 200 concurrent scale-and-waits, shared paced polls vs one poll loop per wait.

The scaler test server (this process) holds ``clusters`` Dask clusters; a
child process (:mod:`benchmarks.fleet_scaler_client`) scales them all at once
with ``wait=True``: once with this tree (polls shared per cluster, one list
per kind while several clusters of that kind are waited on, every poll
paced by the process's limit of ``$DDLSCALE_SCALER_MAX_RPS``), once with
the previous design (commit :data:`benchmarks.previous_design.PREVIOUS`
exported from git: every wait its own poll loop). Lag = the child's return
minus the moment the server made that cluster's last new worker exist (same
clock). Requests per cluster per second = every request the server received
during the run / clusters / the run's length.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from benchmarks.k8s_scale_client import cluster_name
from benchmarks.previous_design import PREVIOUS, command, export
from benchmarks.report import BenchResult, Target
from benchmarks.stats import summarize

NAME = "fleet_scaler"
TITLE = "200 concurrent scaler-service waits: shared, paced polls vs one poll loop per wait"
LAG_LIMIT_S = 1.0
RATE_LIMIT = 1.0
"""Requests per second per cluster, on average."""
REPO_ROOT = Path(__file__).resolve().parents[1]
CLEAN_ENV = ("CLUSTER_SCALER_BASE_URL", "DOMINO_RUN_ID", "DDLSCALE_BACKEND", "DOMINO_API_PROXY", "DOMINO_API_HOST",
             "DOMINO_TOKEN", "DOMINO_API_KEY", "DDLSCALE_SCALER_MAX_RPS")


@dataclass(frozen=True)
class Plan:
    """How much to measure."""

    clusters: int
    ready_delay: float
    """Seconds new worker pods take to exist."""
    max_rps: float
    """``$DDLSCALE_SCALER_MAX_RPS`` of the shared run."""
    replicas: int = 3


QUICK = Plan(clusters=10, ready_delay=2.0, max_rps=100.0)
FULL = Plan(clusters=200, ready_delay=8.0, max_rps=100.0)


def _lane(plan: Plan, tree: Optional[Path], workdir: Path) -> Dict[str, Any]:
    from benchmarks.servers import TimedScalerServer
    from tests.servers.scaler_server import DEFAULT_API_KEY

    server = TimedScalerServer().start()
    try:
        for i in range(plan.clusters):
            server.add_cluster("dask", cluster_name(i), replicas=1, max_replicas=8, min_replicas=1)
        server.set_pod_ready_delay(plan.ready_delay)
        server.clear_requests()
        args = (server.url, DEFAULT_API_KEY, str(plan.clusters), str(plan.replicas), str(workdir / f"state-{tree is not None}"))
        cmd = command(tree, "benchmarks.fleet_scaler_client", *args) if tree else [
            sys.executable, "-m", "benchmarks.fleet_scaler_client", *args]
        env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
        env["DDLSCALE_SCALER_MAX_RPS"] = str(plan.max_rps)
        began = time.time()
        child = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=str(REPO_ROOT), env=env, check=False)
        if child.returncode != 0:
            raise RuntimeError(f"scaler fleet client failed ({child.returncode}): {child.stderr[-2000:]}")
        report = json.loads(child.stdout.strip().splitlines()[-1])
        requests = server.requests
    finally:
        server.stop()
    lags: List[float] = []
    errors = []
    for call in report["calls"]:
        if call["error"]:
            errors.append(f"{call['cluster']}: {call['error'][:200]}")
            continue
        lags.append(call["returned"] - server.ready_moment("scale", call["cluster"]))
    span = max(c["returned"] for c in report["calls"]) - min(c["started"] for c in report["calls"])
    kinds: Dict[str, int] = {}
    for r in requests:
        route = r.path.split("/")[2] if r.path.startswith("/ddl_cluster_scaler/") else r.path
        kinds[f"{r.method} {route}"] = kinds.get(f"{r.method} {route}", 0) + 1
    return {
        "completed": len(lags),
        "errors": errors[:10],
        "error_count": len(errors),
        "lag_s": summarize(lags, 3) if lags else None,
        "wall_s": round(span, 2),
        "requests_total": len(requests),
        "requests_by_route": kinds,
        "requests_per_cluster_per_s": round(len(requests) / plan.clusters / span, 3),
        "peak_client_requests_per_s": _peak_rate(requests),
        "client_peak_rss_mb": round(report["peak_rss_kb"] / 1024.0, 1),
        "started_s_since_launch": round(min(c["started"] for c in report["calls"]) - began, 2),
    }


def _peak_rate(requests: List[Any]) -> int:
    """The most requests the server received in any one second."""
    per: Dict[int, int] = {}
    for r in requests:
        per[int(r.at)] = per.get(int(r.at), 0) + 1
    return max(per.values()) if per else 0


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Both designs on fresh servers of the same size."""
    plan = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="ddlscale-fleet-scaler-") as tmp:
        previous, missing = export(Path(tmp) / "previous")
        lanes = {"shared": _lane(plan, None, Path(tmp))}
        if previous is not None:
            lanes["per_wait"] = _lane(plan, previous, Path(tmp))
    result = BenchResult(NAME, TITLE)
    if missing:
        result.notes.append(missing)
    old_lane = lanes.get("per_wait")
    result.metrics = {
        "plan": {"clusters": plan.clusters, "replicas": f"1 -> {plan.replicas}", "ready_delay_s": plan.ready_delay,
                 "DDLSCALE_SCALER_MAX_RPS": plan.max_rps, "previous_design": missing or f"git {PREVIOUS}"},
        **lanes,
        "headline": [
            f"{name}: {lane['completed']}/{plan.clusters} in {lane['wall_s']} s; lag p95 "
            f"{lane['lag_s']['p95'] if lane['lag_s'] else 'n/a'} s; {lane['requests_per_cluster_per_s']} requests/s/cluster "
            f"({lane['requests_total']} requests, peak {lane['peak_client_requests_per_s']}/s)"
            for name, lane in lanes.items()
        ],
    }
    shared = lanes["shared"]
    result.targets.append(Target("scale-and-waits completed", float(shared["completed"]), float(plan.clusters), "waits", ">="))
    result.targets.append(Target("requests per cluster per second (average)", shared["requests_per_cluster_per_s"],
                                 RATE_LIMIT, "req/s",
                                 detail=f"previous design {old_lane['requests_per_cluster_per_s']} req/s" if old_lane else missing))
    lag = shared["lag_s"]
    result.targets.append(Target("detection lag p95", lag["p95"] if lag else None, LAG_LIMIT_S, "s",
                                 detail=f"previous design p95 {old_lane['lag_s']['p95'] if old_lane and old_lane['lag_s'] else 'n/a'} s"))
    return result
