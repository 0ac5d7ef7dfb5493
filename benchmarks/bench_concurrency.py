"""Concurrent ``ddlscale run`` commands on one local Dask cluster, some killed with SIGKILL at chosen points.

Each round starts ``RUNS`` real ``ddlscale run`` processes at once on one
real local Dask cluster (1 worker outside phases), each asking for 1-4
workers; its command connects to the scheduler and counts the workers it
sees five times over about 1.5 s. ``KILLED`` of them (random, seeded) stop
at a random pause point (:mod:`tests.pause_support`: after the claim, with the
cluster scaled, after the release) and are killed there with SIGKILL.
Beside them one more run, the *stopped holder*, asks for 3 workers with a
short lease (:data:`STOPPED_LEASE`); once its command runs it is stopped
(SIGSTOP) until its claim has lapsed and the round's runs have ended (they
drop its claim and shrink the cluster under its command), then continued
(SIGCONT): it must claim again and say so; its command counts the workers
until the cluster holds it again.

Reported: commands that ever saw fewer workers than they asked for, and of
those, the ones whose run reported no fault (the promise: never below the
count without being told);
commands left running by a killed run; wedged clusters (after the round, a
``ddlscale run --replicas 1 -- true`` that does not succeed, or a cluster
not back at its 1 worker with no live claim); processes left after the
cluster is taken down; each round's time.
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from benchmarks.report import BenchResult, Target
from benchmarks.stats import summarize
from tests.contract_support import stop_outside_locks
from tests.flyte_support import processes_mentioning
from tests.pause_support import Pause

NAME = "concurrency"
TITLE = "Concurrent `ddlscale run` on one local Dask cluster, with SIGKILL at pause points"
RUNS = 8
ROUNDS = 3
KILLED = 3
POINTS = ("claimed", "scaled", "released")
BASELINE = 1
RUN_TIMEOUT = 300.0
"""Seconds one run may take to scale up (eight of them share two cores with the cluster)."""
ROUND_LIMIT = 900.0
"""Seconds a round may take before its remaining runs are killed and counted as hung."""
SEED = 20261204
STOPPED_REPLICAS = 3
STOPPED_LEASE = 4.0
"""Seconds of the stopped holder's lease: it is stopped for longer (until its claim lapsed)."""
FAULT_REPORTED = "fault during the body"
"""What a run's summary says when a fault (its claim lost, the cluster below its count) was reported."""

PROBE = """
import json, os, sys, time
from distributed import Client
need, out = int(sys.argv[1]), sys.argv[2]
address = f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}"
seen = []
with Client(address, timeout=60) as client:
    for _ in range(5):
        seen.append(len(client.scheduler_info()["workers"]))
        time.sleep(0.3)
with open(out, "w") as handle:
    json.dump({"need": need, "seen": seen}, handle)
"""

HELD_PROBE = """
import json, os, sys, time
from distributed import Client
need, out, started, go = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
address = f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}"
seen = []
with Client(address, timeout=60) as client:
    open(started, "w").close()
    while not os.path.exists(go):
        seen.append(len(client.scheduler_info()["workers"]))
        time.sleep(0.3)
with open(out, "w") as handle:
    json.dump({"need": need, "seen": seen}, handle)
"""
"""The stopped holder's command: counts the workers every 0.3 s until told to stop (the ``go`` file)."""

DDLSCALE = str(Path(sys.executable).with_name("ddlscale"))
CLUSTER_ARGS = ["--backend", "local", "--kind", "dask", "--name", "bench-conc"]


def _environment(state: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DDLSCALE_", "DOMINO_", "CLUSTER_SCALER_", "DASK_SCHEDULER_"))}
    env["DDLSCALE_STATE_DIR"] = str(state)
    return env


class _Run:
    """One ``ddlscale run`` of a round, and the pause point where it is to be killed (None: not killed)."""

    def __init__(self, folder: Path, index: int, replicas: int, kill_at: Optional[str], env: Dict[str, str]) -> None:
        self.replicas = replicas
        self.kill_at = kill_at
        self.result = folder / f"seen-{index}.json"
        self.pause = Pause(kill_at) if kill_at is not None else None
        self.killed = False
        env = dict(env)
        self.log = open(folder / f"run-{index}.log", "w")
        argv = self._argv(folder, replicas)
        options: Dict[str, Any] = dict(env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        if self.pause is not None:
            self.proc = self.pause.popen(argv[1:], **options)  # Pause runs ddlscale itself, with its hook
        else:
            self.proc = subprocess.Popen(argv, **options)
        self.started = time.monotonic()
        self.seconds: Optional[float] = None

    def _argv(self, folder: Path, replicas: int) -> List[str]:
        return [DDLSCALE, "run", *CLUSTER_ARGS, "--replicas", str(replicas), "--timeout", str(RUN_TIMEOUT), "--",
                sys.executable, str(folder.parent / "probe.py"), str(replicas), str(self.result)]

    def step(self) -> bool:
        """Kill it once it paused where asked; True once it has exited."""
        if self.pause is not None and not self.killed and self.pause.paused():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.killed = True
        if self.proc.poll() is None:
            return False
        if self.seconds is None:
            self.seconds = time.monotonic() - self.started
            self.log.close()
            if self.pause is not None:
                self.pause.close()
        return True

    def seen(self) -> Optional[List[int]]:
        """The worker counts its command saw, or None when the command did not finish."""
        if not self.result.exists():
            return None
        return list(json.loads(self.result.read_text())["seen"])

    def told(self) -> bool:
        """Whether the run reported a fault (in its summary) once it ended."""
        path = Path(self.log.name)
        return self.log.closed and path.exists() and FAULT_REPORTED in path.read_text()


class _StoppedHolder(_Run):
    """The run stopped (SIGSTOP) past its lease while the round's runs shrink the cluster under it."""

    def __init__(self, folder: Path, env: Dict[str, str]) -> None:
        self.started_file, self.go = folder / "held-started", folder / "held-go"
        self.phase = "starting"
        """starting -> stopped -> continued -> done"""
        super().__init__(folder, 99, STOPPED_REPLICAS, None, env)

    def _argv(self, folder: Path, replicas: int) -> List[str]:
        return [DDLSCALE, "run", *CLUSTER_ARGS, "--replicas", str(replicas), "--timeout", str(RUN_TIMEOUT),
                "--lease-seconds", str(STOPPED_LEASE), "--",
                sys.executable, str(folder.parent / "held_probe.py"), str(replicas), str(self.result),
                str(self.started_file), str(self.go)]

    def advance(self, others_done: bool, claims: Any, ready: Any) -> None:
        """Stop it once its command runs; continue it once its claim lapsed and the others ended; let its
        command end once it holds the cluster again and its workers are back (``ready``: workers ready)."""
        if self.phase == "starting" and self.started_file.exists():
            # Outside its locked steps: stopped inside one (milliseconds per renewal) it would hold the
            # record lock, and every other run would wait for it (a limit docs/reliability.md names).
            stop_outside_locks(self.proc.pid)
            self.phase = "stopped"
        elif self.phase == "stopped" and others_done and not self._holds(claims()):
            os.kill(self.proc.pid, signal.SIGCONT)
            self.phase = "continued"
        elif self.phase == "continued" and self._holds(claims()) and ready() >= self.replicas:
            self.go.touch()
            self.phase = "done"

    def _holds(self, claims: Dict[str, Any]) -> bool:
        return any(claim.holder.endswith(f":{self.proc.pid}") for claim in claims.values())


def _round(number: int, root: Path, env: Dict[str, str], runs: int, killed: int, rng: random.Random) -> Dict[str, Any]:
    folder = root / f"round-{number}"
    folder.mkdir()
    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    victims = set(rng.sample(range(runs), killed))
    started = time.monotonic()
    hung = 0
    records = LocalBackend(state_dir=root / "state" / "local")
    ref = ClusterRef("dask", "bench-conc")
    held = _StoppedHolder(folder, env)
    while not held.started_file.exists() and held.proc.poll() is None:
        time.sleep(0.05)

    def ready() -> int:
        return records.get_state(ref).ready_workers or 0

    held.advance(False, lambda: records.claims(ref), ready)
    batch = [_Run(folder, i, rng.randint(1, 4), rng.choice(POINTS) if i in victims else None, env) for i in range(runs)]
    # Every run is stepped each time (no short cut): a run paused at its point is killed at once.
    while True:
        others_done = all([run.step() for run in batch])
        held.advance(others_done, lambda: records.claims(ref), ready)
        if others_done and held.step():
            break
        if time.monotonic() - started > ROUND_LIMIT:
            for run in [*batch, held]:
                if run.proc.poll() is None:
                    hung += 1
                    os.kill(run.proc.pid, signal.SIGCONT)
                    run.proc.kill()
                    run.proc.wait()
                    run.step()
            break
        time.sleep(0.05)
    records.close()
    batch.append(held)
    seconds = time.monotonic() - started
    orphans = processes_mentioning(str(folder))
    below = [
        {"replicas": run.replicas, "seen": run.seen(), "fault_reported": run.told(), "stopped": run is held}
        for run in batch if run.seen() is not None and min(run.seen() or [0]) < run.replicas
    ]
    return {
        "seconds": round(seconds, 2),
        "runs": [
            {"replicas": run.replicas, "kill_at": run.kill_at, "killed": run.killed, "stopped": run is held,
             "exit": run.proc.returncode, "seconds": round(run.seconds or 0.0, 2), "seen": run.seen(),
             "fault_reported": run.told()}
            for run in batch
        ],
        "below": below,
        "orphan_commands": len(orphans),
        "hung": hung,
        "wedged": _wedged(root, env),
    }


def _wedged(root: Path, env: Dict[str, str]) -> Optional[str]:
    """Why the cluster is wedged after a round, or None: one more run must succeed and leave it at its
    baseline with no live claim."""
    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    check = subprocess.run(
        [DDLSCALE, "run", *CLUSTER_ARGS, "--replicas", "1", "--timeout", str(RUN_TIMEOUT), "--", "true"],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT * 2,
    )
    if check.returncode != 0:
        return f"a later run exited {check.returncode}: {check.stderr.strip()[-300:]}"
    backend = LocalBackend(state_dir=root / "state" / "local")
    ref = ClusterRef("dask", "bench-conc")
    state = backend.get_state(ref)
    claims = backend.claims(ref)
    if state.desired_workers != BASELINE or claims:
        return f"left at {state.describe()} with claims {sorted(claims)}"
    return None


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """``ROUNDS`` rounds of ``RUNS`` runs (quick: 1 round of 3, one killed); every process is stopped afterwards."""
    try:
        import distributed  # noqa: F401

        from flytekitplugins_ddlscale import ClusterRef
        from flytekitplugins_ddlscale.backends.local import LocalBackend
    except ImportError as exc:
        return BenchResult.skipped(NAME, TITLE, f"local Dask not importable: {exc}")
    rounds, runs, killed = (1, 3, 1) if quick else (ROUNDS, RUNS, KILLED)
    rng = random.Random(SEED)
    results: List[Dict[str, Any]] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ddlscale-bench-") as tmp:
        root = Path(tmp)
        (root / "probe.py").write_text(PROBE)
        (root / "held_probe.py").write_text(HELD_PROBE)
        env = _environment(root / "state")
        backend = LocalBackend(state_dir=root / "state" / "local")
        try:
            backend.up(ClusterRef("dask", "bench-conc"), BASELINE, timeout=RUN_TIMEOUT)
            for number in range(rounds):
                results.append(_round(number, root, env, runs, killed, rng))
        finally:
            backend.shutdown_all()
            backend.close()
            leftover = processes_mentioning(tmp)
    total = time.monotonic() - began
    completed = [r for rnd in results for r in rnd["runs"] if r["seen"] is not None]
    below = sum(len(rnd["below"]) for rnd in results)
    untold = sum(1 for rnd in results for seen in rnd["below"] if not seen["fault_reported"])
    stopped_told = sum(1 for rnd in results for r in rnd["runs"] if r["stopped"] and r["fault_reported"])
    orphans = sum(rnd["orphan_commands"] for rnd in results)
    wedged = sum(1 for rnd in results if rnd["wedged"])
    round_seconds = [rnd["seconds"] for rnd in results]
    result = BenchResult(NAME, TITLE)
    result.metrics = {
        "rounds": rounds,
        "runs_per_round": runs,
        "killed_per_round": killed,
        "commands_completed": len(completed),
        "commands_below_their_worker_count": below,
        "commands_below_their_count_without_a_fault_reported": untold,
        "stopped_holders_that_reported_their_fault": stopped_told,
        "orphan_commands": orphans,
        "wedged_clusters": wedged,
        "processes_left_after_down": len(leftover),
        "round_s": summarize(round_seconds, 2),
        "total_s": round(total, 1),
        "per_round": results,
        "headline": [
            f"{rounds} rounds of {runs} concurrent `ddlscale run` ({killed} killed with SIGKILL at pause points per "
            f"round) and one stopped (SIGSTOP) past its lease: {below} of {len(completed)} commands ever saw fewer "
            f"workers than they asked for, {untold} of them without a fault reported ({stopped_told} of {rounds} "
            "stopped holders reported theirs); "
            f"{orphans} commands left running; {wedged} wedged clusters; {len(leftover)} processes left after "
            f"`down`; rounds took median {summarize(round_seconds, 2)['median']:.1f} s"
        ],
    }
    result.targets = [
        Target("commands below their worker count without a fault reported", untold, 0, "commands"),
        Target("stopped holders that reported their fault", stopped_told, rounds, "runs", comparison=">="),
        Target("commands left running by a killed run", orphans, 0, "processes"),
        Target("wedged clusters", wedged, 0, "clusters",
               detail="; ".join(rnd["wedged"] for rnd in results if rnd["wedged"])),
        Target("processes left after down", len(leftover), 0, "processes"),
    ]
    result.notes.append("Real processes on a shared 2-core machine; the round times are indicative only.")
    return result
