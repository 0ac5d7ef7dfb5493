"""Local backend: how long a real local Spark standalone cluster takes to grow 0 -> 2 workers and shrink 2 -> 0.

The master is started once (timed as ``create_master_s``, not in the
cycles). Each repetition then scales it from no workers to 2 workers ALIVE
on the master (``wait=True``: the master's ``/json/`` lists them), and back
to none (each worker decommissioned, then stopped). Every worker is a JVM
started through pyspark's ``spark-class`` (a launcher JVM, then the worker),
so on this shared 2-core machine the figures are dominated by JVM start-up.
"""
from pathlib import Path

from benchmarks.local_cycles import DOWN, HEAD, UP, time_cycles
from benchmarks.report import BenchResult
from benchmarks.stats import summarize

NAME = "local_spark"
TITLE = "Local backend: real Spark standalone workers 0 -> 2 and 2 -> 0"
WORKERS = 2
STEPS = {"create_master_s": HEAD, "up_0_to_2_s": UP, "down_2_to_0_s": DOWN}


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Time ``1`` (quick) or ``5`` up/down cycles; every process is stopped afterwards."""
    from flytekitplugins_ddlscale import UnsupportedOperationError
    from flytekitplugins_ddlscale.backends.local._driver import load_driver

    cycles = 1 if quick else 5
    try:
        load_driver("spark")
    except UnsupportedOperationError as exc:
        return BenchResult.skipped(NAME, TITLE, exc.message)
    times = time_cycles("spark", "bench-spark", WORKERS, cycles)
    stats = {metric: summarize(times[step], 3) for metric, step in STEPS.items()}
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
