"""Local starts beside the frameworks' own, in one run: ``ddlscale local up`` against what a user would
start by hand, alternating, medians of ``--runs`` (5).

- Dask: ``ddlscale local up --kind dask --replicas 4`` (returns once the scheduler reports 4 workers)
  against a Python process that starts ``LocalCluster(n_workers=4, processes=True)`` and returns from
  ``Client.wait_for_workers(4)``, each timed from spawn to ready.
- Ray: ``ddlscale local up --kind ray --replicas 2`` against the same nodes started by hand: ``ray start
  --head --block`` and, once its dashboard answers, two ``ray start --address ... --block``, with the
  flags and token authentication the local backend gives them (the commands of
  :func:`~flytekitplugins_ddlscale.backends.local._ray_ops.head_argv` and ``worker_argv``, without the
  backend's wrapper), timed from the head's spawn until the dashboard lists 2 ALIVE worker nodes.

- The README's quick start (``--only quickstart``): ``pyflyte run examples/hybrid_flow.py hybrid_flow``
  from the repository, as a newcomer runs it (no cluster, a fresh state folder), timed from spawn to exit.

Where the time goes: the floor each side pays before it starts anything, an interpreter importing
what it needs (``ddlscale``'s command line; ``distributed``; Ray's ``ray start``), timed the same way.
Nothing here stops processes it did not start (no ``ray stop``): each by-hand node runs in a session of
its own and that session is ended. Prints JSON.

Run: ``python -m benchmarks.local_start_vs_frameworks [--runs 5] [--only dask|ray|quickstart]``.
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
from typing import Callable, Dict, List, Optional

DASK_WORKERS = 4
RAY_WORKERS = 2
READY_TIMEOUT = 300.0
"""Seconds any start may take before the benchmark gives up on it (and says which)."""

DASK_BY_HAND = f"""
import sys
from distributed import Client, LocalCluster
cluster = LocalCluster(n_workers={DASK_WORKERS}, processes=True, host="127.0.0.1", dashboard_address=None)
client = Client(cluster)
client.wait_for_workers({DASK_WORKERS}, timeout={READY_TIMEOUT})
print("ready", flush=True)
sys.stdin.read()
client.close()
cluster.close()
"""
"""Dask's own: a LocalCluster of 4 worker processes; prints ``ready`` once 4 workers are registered,
then holds them until its stdin closes (closing is not timed)."""


CLI = [sys.executable, "-c", "from flytekitplugins_ddlscale.cli import main; main()"]
IMPORT_FLOORS = {
    "ddlscale_cli": [sys.executable, "-c", "from flytekitplugins_ddlscale.cli import main"],
    "distributed": [sys.executable, "-c", "import distributed"],
}
"""The imports each side pays before it starts a process of its cluster."""


def _env(state: str) -> Dict[str, str]:
    return {**os.environ, "DDLSCALE_STATE_DIR": state}


def time_ddlscale_up(kind: str, replicas: int) -> Dict[str, float]:
    """One ``ddlscale local up`` of a new cluster: seconds from spawn to the head ready (its first "waiting
    for N workers" line) and to exit (which follows N workers ready)."""
    with tempfile.TemporaryDirectory() as state:
        began = time.perf_counter()
        process = subprocess.Popen([*CLI, "local", "up", "--kind", kind, "--name", f"bench-{kind}", "--replicas",
                                    str(replicas)], env=_env(state), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        head_ready = None
        for line in process.stderr:
            if head_ready is None and "waiting for" in line:
                head_ready = time.perf_counter() - began
        if process.wait(timeout=READY_TIMEOUT) != 0:
            raise RuntimeError(f"ddlscale local up --kind {kind} failed (exit {process.returncode})")
        took = time.perf_counter() - began
        subprocess.run([*CLI, "local", "down", "--all"], env=_env(state), check=True, capture_output=True,
                       timeout=READY_TIMEOUT)
    return {"head_ready": head_ready if head_ready is not None else took, "ready": took}


def time_dask_by_hand() -> Dict[str, float]:
    """Seconds from spawning Dask's own LocalCluster process to its ``ready`` line."""
    began = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", DASK_BY_HAND], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        line = process.stdout.readline()
        took = time.perf_counter() - began
        if line.strip() != "ready":
            raise RuntimeError(f"Dask's LocalCluster did not report {DASK_WORKERS} workers (exit {process.poll()})")
    finally:
        process.communicate(timeout=READY_TIMEOUT)
    return {"ready": took}


def _until(what: str, check: Callable[[], bool]) -> None:
    """Poll ``check`` every 50 ms until it holds; RuntimeError naming ``what`` after READY_TIMEOUT."""
    deadline = time.monotonic() + READY_TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {READY_TIMEOUT:.0f} s waiting for {what}")
        time.sleep(0.05)


def time_ray_by_hand() -> Dict[str, float]:
    """Seconds from spawning ``ray start --head`` to its dashboard listing the head, to its client server
    accepting connections, and to 2 ALIVE worker nodes; the nodes started as the local backend starts
    them (same flags, token authentication), by hand, the workers once the dashboard lists the head."""
    from flytekitplugins_ddlscale.backends.local import _ray_ops as ray_ops
    from flytekitplugins_ddlscale.backends.local._supervisor import free_port
    from flytekitplugins_ddlscale.backends.local._tiers import WorkerShape, load_catalog

    shape = WorkerShape.from_tier(load_catalog().tiers()[0])  # the tier a new cluster's workers get
    python = ray_ops.ray_python(ray_ops.ray_executable())
    nodes: List[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as folder:
        token = ray_ops.new_token(Path(folder) / ray_ops.TOKEN_FILE)
        temp = ray_ops.ray_temp_dir(ray_ops.temp_dir(Path(folder)))
        port, dashboard, client = (free_port("127.0.0.1") for _ in range(3))
        url = ray_ops.dashboard_url("127.0.0.1", dashboard)

        def start(argv: List[str]) -> None:
            nodes.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))

        try:
            began = time.perf_counter()
            nodes = ray_ops.RayNodes(python, "127.0.0.1", port, temp, str(token))
            start(ray_ops.head_argv(nodes, dashboard, client))
            _until("the Ray head on its dashboard", lambda: any(
                node.get("is_head_node") for node in ray_ops.alive_nodes(url, str(token), 1.0) or ()))
            steps = {"head_on_dashboard": time.perf_counter() - began}
            for index in range(RAY_WORKERS):
                argv = ray_ops.worker_argv(nodes, f"w{index}", shape, "unused")
                wrapper_end = argv.index("--")
                start([argv[0], *[a for a in argv[1:wrapper_end] if "=" in a], *argv[wrapper_end + 1:]])

            def workers_alive() -> bool:
                if "client_server" not in steps and ray_ops.accepts_connections("127.0.0.1", client, 0.2):
                    steps["client_server"] = time.perf_counter() - began
                return len(ray_ops.alive_worker_nodes(url, str(token), 1.0) or ()) >= RAY_WORKERS

            _until(f"{RAY_WORKERS} ALIVE Ray worker nodes", workers_alive)
            steps["ready"] = time.perf_counter() - began
            return steps
        finally:
            for node in reversed(nodes):
                _end_session(node)


def _end_session(process: subprocess.Popen) -> None:
    """SIGTERM to the node's session (``ray start --block`` stops its node on it), SIGKILL after 30 s."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    except ProcessLookupError:
        pass


REPO_ROOT = Path(__file__).resolve().parents[1]
QUICK_START = [str(Path(sys.executable).parent / "pyflyte"), "run", "examples/hybrid_flow.py", "hybrid_flow"]
"""The README's quick start, run from the repository root."""


def time_quick_start(runs: int) -> Dict[str, object]:
    """Medians of ``runs`` quick starts, each in a fresh state folder (no cluster left from the last)."""
    times, load = [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as state:
            load.append(os.getloadavg()[0])
            began = time.perf_counter()
            done = subprocess.run(QUICK_START, cwd=REPO_ROOT, env=_env(state), capture_output=True, text=True,
                                  timeout=READY_TIMEOUT)
            if done.returncode != 0:
                raise RuntimeError(f"the quick start failed (exit {done.returncode}): {done.stderr[-1500:]}")
            times.append(time.perf_counter() - began)
    return {"command": " ".join(QUICK_START[1:]), "wall_s": _median(times),
            "load_average_1m": [round(x, 2) for x in load]}


def time_imports(runs: int) -> Dict[str, object]:
    """Medians of ``runs`` interpreters that only import what each side needs (:data:`IMPORT_FLOORS`)."""
    floors = {}
    for name, argv in IMPORT_FLOORS.items():
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True, timeout=READY_TIMEOUT)
            times.append(time.perf_counter() - began)
        floors[name] = _median(times)
    return floors


def _median(times: List[float]) -> Dict[str, object]:
    return {"median": round(statistics.median(times), 3), "all": [round(t, 3) for t in times]}


def _medians(runs: List[Dict[str, float]]) -> Dict[str, Dict[str, object]]:
    return {step: _median([run[step] for run in runs if step in run]) for step in runs[0]}


def compare(kind: str, runs: int) -> Dict[str, object]:
    """``runs`` alternating starts of ``ddlscale local up`` and the framework's own: the medians of each
    step, and the ratio of the medians to ready."""
    by_hand: Dict[str, Callable[[], Dict[str, float]]] = {"dask": time_dask_by_hand, "ray": time_ray_by_hand}
    replicas = DASK_WORKERS if kind == "dask" else RAY_WORKERS
    ours: List[Dict[str, float]] = []
    theirs: List[Dict[str, float]] = []
    load: List[float] = []
    for _ in range(runs):
        load.append(os.getloadavg()[0])
        ours.append(time_ddlscale_up(kind, replicas))
        theirs.append(by_hand[kind]())
    ours_s, theirs_s = _medians(ours), _medians(theirs)
    return {"replicas": replicas, "ddlscale_up_s": ours_s, "framework_own_s": theirs_s,
            "ratio_of_medians": round(ours_s["ready"]["median"] / theirs_s["ready"]["median"], 3),
            "load_average_1m": [round(x, 2) for x in load]}


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", choices=("dask", "ray", "quickstart"), action="append")
    args = parser.parse_args(argv)
    chosen = args.only or ["dask", "ray", "quickstart"]
    kinds = [kind for kind in chosen if kind != "quickstart"]
    quick_start = {"quick_start": time_quick_start(args.runs)} if "quickstart" in chosen else {}
    print(json.dumps({"runs": args.runs, "cpus": os.cpu_count(),
                      **{kind: compare(kind, args.runs) for kind in kinds}, **quick_start,
                      "import_floors_s": time_imports(args.runs)}, indent=1))


if __name__ == "__main__":
    main()
