"""Local backend: how long real local Dask clusters take to grow 0 -> 4 workers and shrink 4 -> 0.

Each repetition scales a running scheduler (created once, not timed in the
figures) from no workers to 4 Ready workers (as the scheduler reports them)
with ``wait=True``, then back to none. Real ``dask worker`` processes start
and stop, so on this shared 2-core machine the figures are dominated by
Python start-up of the worker processes.
"""
from pathlib import Path

from benchmarks.local_cycles import DOWN, HEAD, UP, time_cycles
from benchmarks.report import BenchResult
from benchmarks.stats import summarize

NAME = "local_dask"
TITLE = "Local backend: real Dask workers 0 -> 4 and 4 -> 0"
WORKERS = 4
STEPS = {"create_scheduler_s": HEAD, "up_0_to_4_s": UP, "down_4_to_0_s": DOWN}


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Time ``1`` (quick) or ``5`` up/down cycles; every process is stopped afterwards."""
    try:
        import flytekitplugins_ddlscale.backends.local  # noqa: F401
    except ImportError as exc:
        return BenchResult.skipped(NAME, TITLE, f"local backend not importable: {exc}")
    cycles = 1 if quick else 5
    times = time_cycles("dask", "bench-local", WORKERS, cycles, timeout=180)
    stats = {metric: summarize(times[step], 3) for metric, step in STEPS.items()}
    result = BenchResult(NAME, TITLE)
    result.metrics = {
        "cycles": cycles,
        **stats,
        "headline": [
            f"local Dask: 0 -> {WORKERS} Ready workers median {stats['up_0_to_4_s']['median']:.2f} s "
            f"(p95 {stats['up_0_to_4_s']['p95']:.2f} s), {WORKERS} -> 0 median {stats['down_4_to_0_s']['median']:.2f} s"
        ],
    }
    result.notes.append("Reported, no target: real processes on a shared 2-core machine.")
    return result
