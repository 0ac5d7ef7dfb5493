"""Scale: one process scales 200 clusters at once through the Kubernetes backend.

The Kubernetes test server (this process) holds 200 Ray clusters of one
worker each; a child process (:mod:`benchmarks.k8s_scale_client`) scales
them all to 4 workers concurrently with ``wait=True``. Lag per cluster = the
child's return minus the moment the server stored that cluster's last new
worker Ready (same machine clock). Peak RSS is the child's alone.
"""
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

from benchmarks.k8s_scale_client import NAMESPACE, OWNER, cluster_name
from benchmarks.report import BenchResult, Target
from benchmarks.stats import summarize

NAME = "k8s_200"
TITLE = "200 clusters scaled concurrently by one process (Kubernetes backend)"
LAG_LIMIT_MS = 250.0
RSS_LIMIT_MB = 300.0
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Plan:
    """How much to measure."""

    clusters: int
    ready_delay: float
    """Seconds each new worker pod takes to become Ready."""
    replicas: int = 4


QUICK = Plan(clusters=10, ready_delay=0.5)
FULL = Plan(clusters=200, ready_delay=3.0)


def _create(server: Any, plan: Plan) -> None:
    for i in range(plan.clusters):
        server.add_cluster(
            "ray", cluster_name(i), NAMESPACE, replicas=1,
            autoscaling={"minReplicas": 1, "maxReplicas": 8}, owner=OWNER, wait_ready=False,
        )
    deadline = time.monotonic() + 120
    while len(server.ready_moments_all("worker")) < plan.clusters:
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after 120 s waiting for {plan.clusters} clusters to come up")
        time.sleep(0.1)


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Create the clusters, run the child, and compute lag, completions and peak RSS."""
    try:
        import flytekitplugins_ddlscale.backends.kubernetes  # noqa: F401
        import tests.servers.k8s_server  # noqa: F401
    except ImportError as exc:
        return BenchResult.skipped(NAME, TITLE, f"kubernetes backend or its test server not importable: {exc}")
    from benchmarks.servers import timed_k8s_server

    plan = QUICK if quick else FULL
    server = timed_k8s_server(ready_delay=0.0).start()
    try:
        _create(server, plan)
        server.set_ready_delay(plan.ready_delay)
        server.clear_log()
        launched = time.time()
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.k8s_scale_client", server.url, str(plan.clusters), str(plan.replicas)],
            capture_output=True, text=True, timeout=600, cwd=str(REPO_ROOT), check=False,
        )
        if child.returncode != 0:
            raise RuntimeError(f"scale client failed ({child.returncode}): {child.stderr[-2000:]}")
        report: Dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
        lags: List[float] = []
        errors = []
        for call in report["calls"]:
            if call["error"]:
                errors.append(f"{call['cluster']}: {call['error']}")
                continue
            moments = server.ready_moments(call["cluster"], "worker", since=launched)
            if len(moments) < plan.replicas - 1:
                errors.append(f"{call['cluster']}: returned with {len(moments)} new Ready workers")
                continue
            lags.append((call["returned"] - max(moments)) * 1000.0)
        requests = len(server.requests)
    finally:
        server.close()
    completed = len(lags)
    result = BenchResult(NAME, TITLE)
    lag_stats = summarize(lags, 1) if lags else None
    span = max(c["returned"] for c in report["calls"]) - min(c["started"] for c in report["calls"])
    result.metrics = {
        "plan": {"clusters": plan.clusters, "replicas": f"1 -> {plan.replicas}", "ready_delay_s": plan.ready_delay},
        "completed": completed,
        "errors": errors[:20],
        "lag_ms": lag_stats,
        "wall_time_s": round(span, 2),
        "call_duration_s": summarize([c["returned"] - c["started"] for c in report["calls"]], 3),
        "requests_total": requests,
        "requests_per_cluster": round(requests / plan.clusters, 1),
        "client_rss_mb": {
            "before_first_call": round(report["rss_before_kb"] / 1024.0, 1),
            "peak": round(report["peak_rss_kb"] / 1024.0, 1),
        },
        "headline": [
            f"{completed}/{plan.clusters} clusters scaled in {span:.1f} s; lag p95 "
            f"{lag_stats['p95'] if lag_stats else 'n/a'} ms; client peak RSS {report['peak_rss_kb'] / 1024.0:.0f} MB"
        ],
    }
    result.targets.append(Target("clusters completed", float(completed), float(plan.clusters), "clusters", ">="))
    result.targets.append(
        Target("detection lag p95", lag_stats["p95"] if lag_stats else None, LAG_LIMIT_MS, "ms",
               detail=f"median {lag_stats['median']} ms" if lag_stats else "no cluster completed")
    )
    result.targets.append(Target("client peak RSS", round(report["peak_rss_kb"] / 1024.0, 1), RSS_LIMIT_MB, "MB"))
    return result
