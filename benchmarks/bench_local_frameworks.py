"""Local backend, per framework: real workers 0 -> 2 ready and 2 -> 0.

For each framework the local backend runs, the head is created once (timed
apart), then each cycle scales it from no workers to 2 ready workers (as the
head reports them: Dask scheduler, Ray dashboard's ALIVE worker nodes) with
``wait=True`` and back to none. A framework that is not installed is
recorded in the notes and left out. On this shared 2-core machine the
figures are dominated by process start-up (Ray starts 5 processes per node).
"""
from pathlib import Path
from typing import Dict

from benchmarks.local_cycles import DOWN, HEAD, UP, time_cycles
from benchmarks.report import BenchResult
from benchmarks.stats import summarize

NAME = "local_frameworks"
TITLE = "Local backend: real workers 0 -> 2 ready and 2 -> 0, per framework"
WORKERS = 2
FRAMEWORKS = ("dask", "ray")
STEPS = {"create_head_s": HEAD, "up_0_to_2_s": UP, "down_2_to_0_s": DOWN}


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Time ``1`` (quick) or ``3`` up/down cycles per framework; every process is stopped afterwards."""
    try:
        from flytekitplugins_ddlscale.backends.local._driver import load_driver
        from flytekitplugins_ddlscale.errors import UnsupportedOperationError
    except ImportError as exc:
        return BenchResult.skipped(NAME, TITLE, f"local backend not importable: {exc}")
    cycles = 1 if quick else 3
    result = BenchResult(NAME, TITLE)
    metrics: Dict[str, object] = {"cycles": cycles, "workers": WORKERS}
    headline = []
    for kind in FRAMEWORKS:
        try:
            load_driver(kind)
        except (KeyError, UnsupportedOperationError) as exc:
            result.notes.append(f"{kind} left out: {exc}")
            continue
        times = time_cycles(kind, f"bench-{kind}", WORKERS, cycles)
        stats = {metric: summarize(times[step], 3) for metric, step in STEPS.items()}
        metrics[kind] = stats
        headline.append(
            f"local {kind}: 0 -> {WORKERS} ready median {stats['up_0_to_2_s']['median']:.1f} s, "
            f"{WORKERS} -> 0 median {stats['down_2_to_0_s']['median']:.1f} s "
            f"(head start {stats['create_head_s']['median']:.1f} s)"
        )
    metrics["headline"] = headline
    result.metrics = metrics
    result.notes.append("Reported, no target: real processes on a shared 2-core machine (see loadavg).")
    return result
