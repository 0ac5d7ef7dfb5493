"""What authentication costs a local start: ``ddlscale local up --kind KIND --replicas N`` (Dask by default;
Ray's TLS too), timed with this tree's code and with another tree's (the code before TLS), alternating.

Run: ``python -m benchmarks.local_tls_cost --before DIR [--kind dask|ray] [--replicas 2] [--runs 5]``, where ``DIR``
holds the package of the code to compare with (``git archive <commit> | tar -x -C DIR``); each run
starts in a fresh state directory with ``PYTHONPATH`` set to the tree under test, so the same
interpreter and installed packages run both. Each ``up`` returns once the scheduler reports N workers;
each cluster is taken down (untimed) before the next run. Also timed in this process: making one
cluster's certificate authority and certificate (:func:`~.dask_tls.ensure_tls`). Prints JSON.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent.parent


def time_up(tree: Path, replicas: int, kind: str = "dask") -> float:
    """Seconds of one ``local up`` of a new cluster of ``kind`` with the package in ``tree``."""
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "PYTHONPATH": str(tree), "DDLSCALE_STATE_DIR": state}
        command = [sys.executable, "-c", "from flytekitplugins_ddlscale.cli import main; main()", "local"]
        began = time.perf_counter()
        # Run from the state directory: ``python -c`` puts its working directory before PYTHONPATH, so from a
        # clone both runs would import the clone's package.
        subprocess.run([*command, "up", "--kind", kind, "--name", "bench-tls", "--replicas", str(replicas)],
                       env=env, cwd=state, check=True, capture_output=True, timeout=300)
        took = time.perf_counter() - began
        subprocess.run([*command, "down", "--all"], env=env, cwd=state, check=True, capture_output=True, timeout=300)
    return took


def time_certificates(runs: int) -> List[float]:
    """Seconds to make one cluster's TLS files, ``runs`` times."""
    from flytekitplugins_ddlscale.backends.local._secrets import ensure_tls

    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            ensure_tls(Path(folder))
            times.append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a tree holding the package before TLS")
    parser.add_argument("--kind", choices=("dask", "ray"), default="dask")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": HERE}
    times: Dict[str, List[float]] = {label: [] for label in trees}
    for _ in range(args.runs):
        for label, tree in trees.items():
            times[label].append(time_up(tree, args.replicas, args.kind))
    certificates = time_certificates(args.runs)
    print(json.dumps({
        "kind": args.kind, "replicas": args.replicas, "runs": args.runs,
        "load_average_1m": os.getloadavg()[0],
        **{f"{label}_up_s": {"median": round(statistics.median(t), 3), "all": [round(x, 3) for x in t]}
           for label, t in times.items()},
        "median_difference_s": round(statistics.median(times["after"]) - statistics.median(times["before"]), 3),
        "certificates_s": {"median": round(statistics.median(certificates), 4), "max": round(max(certificates), 4)},
    }, indent=1))


if __name__ == "__main__":
    main()
