"""Local backend: how long a real local Spark standalone cluster takes to grow 0 -> 2 workers and shrink 2 -> 0.

The master is started once (timed as ``create_master_s``, not in the
cycles). Each repetition then scales it from no workers to 2 workers ALIVE
on the master (``wait=True``: the master's ``/json/`` lists them), and back
to none (each worker decommissioned, then stopped). Every worker is a JVM
started through pyspark's ``spark-class`` (a launcher JVM, then the worker),
so on this shared 2-core machine the figures are dominated by JVM start-up.
"""
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.report import BenchResult
from benchmarks.stats import summarize

NAME = "local_spark"
TITLE = "Local backend: real Spark standalone workers 0 -> 2 and 2 -> 0"
WORKERS = 2


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Time ``1`` (quick) or ``5`` up/down cycles; every process is stopped afterwards."""
    from flytekitplugins_ddlscale import ClusterRef, UnsupportedOperationError
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    cycles = 1 if quick else 5
    ref = ClusterRef("spark", "bench-spark")
    times: Dict[str, List[float]] = {"create_master_s": [], "up_0_to_2_s": [], "down_2_to_0_s": []}
    with tempfile.TemporaryDirectory(prefix="ddlscale-bench-") as tmp:
        backend = LocalBackend(state_dir=Path(tmp) / "local")
        try:
            try:
                backend.driver(ref)
            except UnsupportedOperationError as exc:
                return BenchResult.skipped(NAME, TITLE, exc.message)
            started = time.perf_counter()
            backend.up(ref, 0, timeout=300)
            times["create_master_s"].append(time.perf_counter() - started)
            for _ in range(cycles):
                started = time.perf_counter()
                result = backend.scale(ref, WORKERS, wait=True, timeout=300)
                times["up_0_to_2_s"].append(time.perf_counter() - started)
                if result.final.ready_workers != WORKERS:
                    raise RuntimeError(f"scale returned with {result.final.describe()}")
                started = time.perf_counter()
                result = backend.scale(ref, 0, wait=True, timeout=300)
                times["down_2_to_0_s"].append(time.perf_counter() - started)
                if result.final.existing_workers != 0:
                    raise RuntimeError(f"scale returned with {result.final.describe()}")
        finally:
            backend.shutdown_all()
            backend.close()
    stats = {name: summarize(values, 3) for name, values in times.items()}
    result = BenchResult(NAME, TITLE)
    result.metrics = {
        "cycles": cycles,
        **stats,
        "headline": [
            f"local Spark: 0 -> {WORKERS} workers ALIVE on the master median {stats['up_0_to_2_s']['median']:.2f} s "
            f"(p95 {stats['up_0_to_2_s']['p95']:.2f} s), {WORKERS} -> 0 median {stats['down_2_to_0_s']['median']:.2f} s; "
            f"master start {stats['create_master_s']['median']:.2f} s"
        ],
    }
    result.notes.append("Reported, no target: real JVM processes on a shared 2-core machine.")
    return result
