"""What a timeout holds when a local Dask scheduler hangs: ``ddlscale local up --replicas 2 --timeout 2``
and ``ddlscale run --replicas 2 --timeout 2 -- true`` on a cluster of 1 worker whose scheduler is stopped
(SIGSTOP: it accepts connections and never answers), and a phase (``replicas=2, timeout=2``) creating a
cluster whose scheduler is stopped as soon as it is recorded (a pause hook in its process), timed with
this tree's code and another tree's.

Run: ``python -m benchmarks.hung_timeout --before DIR [--runs 3]``, where ``DIR`` holds the package of the
code to compare with (``git archive <commit> | tar -x -C DIR``); each run starts in a fresh state directory
with ``PYTHONPATH`` set to the tree under test, so the same interpreter and installed packages run both. The
cluster is made (``up --replicas 1``, untimed), its scheduler stopped, the command timed to its exit (both
fail: exit 3), the scheduler continued and the cluster taken down (untimed). Prints JSON with each
command's wall time and the last line of its error.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent.parent
NAME = "hung"
COMMANDS = {
    "local_up": ["local", "up", "--kind", "dask", "--name", NAME, "--replicas", "2", "--timeout", "2"],
    "run": ["run", "--kind", "dask", "--name", NAME, "--replicas", "2", "--timeout", "2", "--", "true"],
}


def time_hung(tree: Path, command: List[str]) -> Dict[str, object]:
    """Wall time and outcome of ``ddlscale *command`` with the package in ``tree``, on a hung scheduler."""
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "PYTHONPATH": str(tree), "DDLSCALE_STATE_DIR": state}
        ddlscale = [sys.executable, "-c", "from flytekitplugins_ddlscale.cli import main; main()"]
        # Run from the state directory: ``python -c`` puts its working directory before PYTHONPATH.
        subprocess.run([*ddlscale, "local", "up", "--kind", "dask", "--name", NAME, "--replicas", "1", "--timeout", "120"],
                       env=env, cwd=state, check=True, capture_output=True, timeout=300)
        record = json.loads((Path(state) / "local" / "clusters" / f"_.dask.{NAME}" / "cluster.json").read_text())
        scheduler = int(record["scheduler"]["pid"])
        os.kill(scheduler, signal.SIGSTOP)
        try:
            began = time.perf_counter()
            done = subprocess.run([*ddlscale, *command], env=env, cwd=state, capture_output=True, text=True, timeout=600)
            took = time.perf_counter() - began
        finally:
            os.kill(scheduler, signal.SIGCONT)
            subprocess.run([*ddlscale, "local", "down", "--all"], env=env, cwd=state, capture_output=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return {"seconds": round(took, 2), "exit": done.returncode, "error": lines[-1][:900] if lines else ""}


CREATING = """
import json, os, signal, sys, time
from flytekitplugins_ddlscale._core.lifetime import add_pause_hook
from flytekitplugins_ddlscale._services.hold import cluster_phase
from flytekitplugins_ddlscale.backends.local import LocalBackend
from flytekitplugins_ddlscale.refs import ClusterRef
ref, backend, stopped = ClusterRef("dask", "%s"), LocalBackend(), []
def stop(point):
    if point == "worker-started" and not stopped:
        stopped.append(backend.store.load(ref).scheduler.pid)
        os.kill(stopped[0], signal.SIGSTOP)
add_pause_hook(stop)
began = time.perf_counter()
try:
    with cluster_phase(ref, 2, timeout=2, deck=False):
        pass
    error = ""
except Exception as exc:
    error = str(exc)
took = time.perf_counter() - began
for pid in stopped:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
print(json.dumps({"seconds": round(took, 2), "left": [str(r) for r in backend.list_clusters()], "error": error}))
""" % NAME


def time_creating(tree: Path) -> Dict[str, object]:
    """Wall time of a phase (``cluster_phase(replicas=2, timeout=2)``) that creates the cluster, whose
    scheduler is stopped as soon as it is recorded, to the phase's error (its restore included)."""
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "PYTHONPATH": str(tree), "DDLSCALE_STATE_DIR": state}
        done = subprocess.run([sys.executable, "-c", CREATING], env=env, cwd=state, capture_output=True, text=True,
                              timeout=600)
        subprocess.run([sys.executable, "-c", "from flytekitplugins_ddlscale.cli import main; main()", "local", "down",
                        "--all"], env=env, cwd=state, capture_output=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a tree holding the package to compare with")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": HERE}
    runs: Dict[str, Dict[str, List[Dict[str, object]]]] = {
        name: {label: [] for label in trees} for name in COMMANDS
    }
    creating: Dict[str, List[Dict[str, object]]] = {label: [] for label in trees}
    for _ in range(args.runs):
        for name, command in COMMANDS.items():
            for label, tree in trees.items():
                runs[name][label].append(time_hung(tree, command))
        for label, tree in trees.items():
            creating[label].append(time_creating(tree))
    print(json.dumps({
        "runs": args.runs, "load_average_1m": os.getloadavg()[0],
        "phase_creating": {label: {"median_s": statistics.median(float(r["seconds"]) for r in results),  # type: ignore[arg-type]
                                   "all_s": [r["seconds"] for r in results], "left": [r["left"] for r in results],
                                   "last_error": results[-1]["error"]}
                           for label, results in creating.items()},
        **{name: {label: {"median_s": statistics.median(float(r["seconds"]) for r in results),  # type: ignore[arg-type]
                          "all_s": [r["seconds"] for r in results], "exits": [r["exit"] for r in results],
                          "last_error": results[-1]["error"]}
                  for label, results in by_tree.items()}
           for name, by_tree in runs.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
