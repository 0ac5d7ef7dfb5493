"""Overhead of the Flyte surfaces over direct backend calls, in flytekit local execution.

The cluster (``ray/ray-bench`` on the scaler test server) is already at the
requested size and pods appear at once, so every backend call costs the same
few HTTP round trips and the differences below are the plugin's own cost:

* ScaleCluster: the node called in local execution, minus ``backend.scale``
  on an open backend (the node also builds and closes its backend, converts
  its typed output and records its Deck: all counted as overhead).
* @distributed_phase: a task with the decorator minus the same task without
  it, minus the two backend calls a phase makes (scale, then restore of the
  baseline), measured directly.

Rounds interleave every variant so that machine noise hits each alike; the
first rounds warm imports and caches and are dropped.
"""
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, List

from benchmarks.report import BenchResult, Target
from benchmarks.stats import median, summarize

NAME = "task_overhead"
TITLE = "ScaleCluster node and @distributed_phase overhead over direct backend calls"
LIMIT_MS = 150.0
WARMUP = 2
ENV = ("CLUSTER_SCALER_BASE_URL", "DOMINO_API_KEY", "DDLSCALE_STATE_DIR", "DDLSCALE_BACKEND", "DOMINO_API_PROXY",
       "DOMINO_TOKEN", "DOMINO_RUN_ID")


@contextmanager
def _environment(values: Dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ENV}
    for key in ENV:
        os.environ.pop(key, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000.0


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Interleave the variants over ``4`` (quick) or ``30`` measured rounds."""
    try:
        from benchmarks import flyte_tasks
        from benchmarks.servers import TimedScalerServer
        from flytekitplugins_ddlscale import ClusterRef, get_backend
        from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend
        from tests.servers.scaler_server import DEFAULT_API_KEY
    except ImportError as exc:
        return BenchResult.skipped(NAME, TITLE, f"tasks, phase or scaler backend not importable: {exc}")
    rounds = 4 if quick else 30
    ref = ClusterRef.parse(flyte_tasks.CLUSTER)
    names = ("direct_scale", "scale_node", "direct_pair", "plain_task", "phased_task", "backend_open_close")
    samples: Dict[str, List[float]] = {k: [] for k in names}
    with tempfile.TemporaryDirectory(prefix="ddlscale-bench-") as tmp, TimedScalerServer() as server:
        server.add_cluster(ref.kind, ref.name, replicas=flyte_tasks.REPLICAS, max_replicas=8, min_replicas=1)
        env = {"CLUSTER_SCALER_BASE_URL": server.url, "DOMINO_API_KEY": DEFAULT_API_KEY, "DDLSCALE_STATE_DIR": tmp}
        with _environment(env):
            backend = ScalerServiceBackend()
            try:
                def pair() -> None:
                    backend.scale(ref, flyte_tasks.REPLICAS, wait=True, timeout=60)
                    backend.restore_baseline(ref, wait=True, timeout=60)

                variants: Dict[str, Callable[[], object]] = {
                    "direct_scale": lambda: backend.scale(ref, flyte_tasks.REPLICAS, wait=True, timeout=60),
                    "scale_node": lambda: flyte_tasks.scale_node(),
                    "direct_pair": pair,
                    "plain_task": lambda: flyte_tasks.plain_task(x=1),
                    "phased_task": lambda: flyte_tasks.phased_task(x=1),
                    # Part of both surfaces' overhead: they open (and close) a backend per run.
                    "backend_open_close": lambda: get_backend("scaler").close(),
                }
                order = list(variants)
                for i in range(WARMUP + rounds):
                    # Rotate the order so no variant always runs right after the same neighbour.
                    for name in order[i % len(order):] + order[: i % len(order)]:
                        elapsed = _timed(variants[name])
                        if i >= WARMUP:
                            samples[name].append(elapsed)
                    # The direct scale records a baseline; the pair's restore forgets it. Start each round clean.
                    if backend.get_baseline(ref) is not None:
                        backend.restore_baseline(ref, wait=True, timeout=60)
            finally:
                backend.close()
            # Sanity: each surface really went through the backend to the server.
            seen = {}
            for name in ("scale_node", "phased_task"):
                server.clear_requests()
                variants[name]()
                seen[name] = len(server.requests)
                if not server.count("PATCH", "/scale/"):
                    raise RuntimeError(f"{name} sent no scale request to the test server")
    stats = {name: summarize(values, 2) for name, values in samples.items()}
    node_overhead = [s - median(samples["direct_scale"]) for s in samples["scale_node"]]
    phase_overhead = [
        s - median(samples["plain_task"]) - median(samples["direct_pair"]) for s in samples["phased_task"]
    ]
    node = summarize(node_overhead, 2)
    phase = summarize(phase_overhead, 2)
    result = BenchResult(NAME, TITLE)
    result.metrics = {
        "rounds": rounds,
        "warmup_rounds_dropped": WARMUP,
        "variants_ms": stats,
        "requests_per_call": seen,
        "scale_node_overhead_ms": node,
        "phase_overhead_ms": phase,
        "headline": [
            f"ScaleCluster node adds {node['median']:.0f} ms over backend.scale ({stats['direct_scale']['median']:.0f} ms); "
            f"@distributed_phase adds {phase['median']:.0f} ms over a plain task "
            f"({stats['plain_task']['median']:.0f} ms) plus its two backend calls ({stats['direct_pair']['median']:.0f} ms)"
        ],
    }
    result.targets.append(
        Target("ScaleCluster node overhead over backend.scale (median)", node["median"], LIMIT_MS, "ms",
               detail=f"p95 {node['p95']} ms")
    )
    result.targets.append(
        Target("@distributed_phase overhead beyond its two backend calls (median)", phase["median"], LIMIT_MS, "ms",
               detail=f"p95 {phase['p95']} ms")
    )
    return result
