"""One way to start a local Dask worker (issue 45): ``ddlscale local up --kind dask --replicas 4`` with the
workers forked by the scheduler's process, the same with every worker a program of its own, and Dask's own
``LocalCluster(n_workers=4)``, side by side.

Each round runs the three starts one after another, in a rotating order (so none always follows the
same one), each timed from spawn to ready as :mod:`benchmarks.local_start_vs_frameworks` times them; the
load average (1 min) is read before each start. Without ``--forking`` the workers start as programs of
their own whatever the package does (this module sets ``_procs.FORKING`` off in the command's process
where the package still has it). Prints JSON: medians and every figure.

Run: ``python -m benchmarks.local_dask_one_way [--runs 5] [--forking]``.
"""
import argparse
import json
import os
import sys
from typing import Dict, List, Optional

from benchmarks import local_start_vs_frameworks as sides

WORKERS = sides.DASK_WORKERS
UNFORKED_CLI = [sys.executable, "-c", (
    "from flytekitplugins_ddlscale.backends.local import _procs\n"
    "if hasattr(_procs, 'FORKING'): _procs.FORKING = False\n"
    "from flytekitplugins_ddlscale.cli import main; main()"
)]
"""The ``ddlscale`` command with every worker started as a program of its own."""


def time_up(cli: List[str]) -> Dict[str, float]:
    """``ddlscale local up --kind dask --replicas 4`` run by ``cli`` (:func:`sides.time_ddlscale_up`)."""
    saved = sides.CLI
    sides.CLI = cli
    try:
        return sides.time_ddlscale_up("dask", WORKERS)
    finally:
        sides.CLI = saved


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--forking", action="store_true", help="also time the package's forked start")
    args = parser.parse_args(argv)
    starts = {"unforked_up": lambda: time_up(UNFORKED_CLI), "local_cluster": sides.time_dask_by_hand}
    if args.forking:
        starts["forked_up"] = lambda: time_up(sides.CLI)
    names = list(starts)
    figures: Dict[str, List[Dict[str, float]]] = {name: [] for name in names}
    load: Dict[str, List[float]] = {name: [] for name in names}
    for round_ in range(args.runs):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            load[name].append(round(os.getloadavg()[0], 2))
            figures[name].append(starts[name]())
            print(name, figures[name][-1], file=sys.stderr, flush=True)
    medians = {name: sides._medians(runs) for name, runs in figures.items()}
    print(json.dumps({
        "runs": args.runs, "cpus": os.cpu_count(), "workers": WORKERS,
        "ready_s": medians, "load_average_1m": load,
        "ratio_to_local_cluster": {name: round(medians[name]["ready"]["median"]
                                               / medians["local_cluster"]["ready"]["median"], 3)
                                   for name in names},
    }, indent=1))


if __name__ == "__main__":
    main()
