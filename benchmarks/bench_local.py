"""Local backend: how long real local Dask clusters take to grow 0 -> 4 workers and shrink 4 -> 0.

Each repetition scales a running scheduler (created once, not timed in the
figures) from no workers to 4 Ready workers (as the scheduler reports them)
with ``wait=True``, then back to none. Real ``dask worker`` processes start
and stop, so on this shared 2-core machine the figures are dominated by
Python start-up of the worker processes.
"""
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.report import BenchResult
from benchmarks.stats import summarize

NAME = "local_dask"
TITLE = "Local backend: real Dask workers 0 -> 4 and 4 -> 0"
WORKERS = 4


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Time ``1`` (quick) or ``5`` up/down cycles; every process is stopped afterwards."""
    try:
        from flytekitplugins_ddlscale import ClusterRef
        from flytekitplugins_ddlscale.backends.local import LocalBackend
    except ImportError as exc:
        return BenchResult.skipped(NAME, TITLE, f"local backend not importable: {exc}")
    cycles = 1 if quick else 5
    ref = ClusterRef("dask", "bench-local")
    times: Dict[str, List[float]] = {"create_scheduler_s": [], "up_0_to_4_s": [], "down_4_to_0_s": []}
    with tempfile.TemporaryDirectory(prefix="ddlscale-bench-") as tmp:
        backend = LocalBackend(state_dir=Path(tmp) / "local")
        try:
            started = time.perf_counter()
            backend.up(ref, 0, timeout=120)
            times["create_scheduler_s"].append(time.perf_counter() - started)
            for _ in range(cycles):
                started = time.perf_counter()
                result = backend.scale(ref, WORKERS, wait=True, timeout=180)
                times["up_0_to_4_s"].append(time.perf_counter() - started)
                if result.final.ready_workers != WORKERS:
                    raise RuntimeError(f"scale returned with {result.final.describe()}")
                started = time.perf_counter()
                result = backend.scale(ref, 0, wait=True, timeout=180)
                times["down_4_to_0_s"].append(time.perf_counter() - started)
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
            f"local Dask: 0 -> {WORKERS} Ready workers median {stats['up_0_to_4_s']['median']:.2f} s "
            f"(p95 {stats['up_0_to_4_s']['p95']:.2f} s), {WORKERS} -> 0 median {stats['down_4_to_0_s']['median']:.2f} s"
        ],
    }
    result.notes.append("Reported, no target: real processes on a shared 2-core machine.")
    return result
