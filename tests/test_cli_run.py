"""``ddlscale run`` as a real subprocess: on real local Dask clusters and on the scaler test server.

Each test starts the installed ``ddlscale`` console script with a real
command as its child, and checks the cluster afterwards: back at its
baseline (the scaler server's ``spec.worker.replicas``; for the local
backend, the cluster the run created is gone and no process is left).
"""
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List

import pytest

from tests.pause_support import Pause
from tests.servers.scaler_server import DEFAULT_API_KEY
from tests.contract_support import stop_outside_locks
from tests.test_local_support import processes_mentioning

DDLSCALE = str(Path(sys.executable).with_name("ddlscale"))
START_TIMEOUT = 90.0
"""Seconds a run may take to import, scale up and start its command on this shared 2-core machine."""

# A child that says it started, then waits to be signalled; the trap records which signal came.
WAIT_FOR_SIGNAL = (
    'trap "echo TERM > $0.got; exit 143" TERM; trap "echo INT > $0.got; exit 130" INT; '
    "touch $0; while :; do sleep 0.05; done"
)


@dataclass
class Target:
    """Where a run scales: the CLI arguments naming the cluster, its environment, and how to read its size."""

    args: List[str]
    env: Dict[str, str]
    baseline: int
    size: Callable[[], int]
    requests: Callable[[], int]
    """Changing requests the backend has seen (PATCHes to the scaler service; local clusters created)."""


def _environment(**values: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOMINO_", "DDLSCALE_", "CLUSTER_SCALER_"))}
    env.update(values)
    return env


@pytest.fixture
def scaler_target(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=4)
    env = _environment(
        CLUSTER_SCALER_BASE_URL=scaler_server.url,
        DOMINO_API_KEY=DEFAULT_API_KEY,
        DDLSCALE_STATE_DIR=str(tmp_path / "state"),
        DDLSCALE_BACKEND="scaler",
    )
    return Target(
        args=["--kind", "ray", "--name", "ray-run1"],
        env=env,
        baseline=1,
        size=lambda: scaler_server.cluster_object("ray", "ray-run1")["spec"]["worker"]["replicas"],
        requests=lambda: scaler_server.count("PATCH"),
    )


@pytest.fixture
def local_target(tmp_path):
    from flytekitplugins_ddlscale.backends.local import LocalBackend
    from flytekitplugins_ddlscale.refs import ClusterRef

    state = tmp_path / "state"
    backend = LocalBackend(state_dir=state / "local")
    ref = ClusterRef("dask", "runner")

    def size() -> int:
        return backend.get_state(ref).desired_workers if backend.list_clusters() else 0

    yield Target(
        args=["--backend", "local", "--kind", "dask", "--name", "runner", "--create"],
        env=_environment(DDLSCALE_STATE_DIR=str(state)),
        baseline=0,
        size=size,
        requests=lambda: len(backend.list_clusters()),
    )
    backend.shutdown_all()
    assert processes_mentioning(str(state)) == [], "local Dask processes left running"


@pytest.fixture(params=["local", "scaler"])
def target(request):
    return request.getfixturevalue(f"{request.param}_target")


def popen(argv: List[str], env: Dict[str, str]) -> "subprocess.Popen[str]":
    # No terminal on stdin: with one, a SIGINT is the terminal's to deliver and is not forwarded.
    return subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def start(target: Target, *args: str) -> "subprocess.Popen[str]":
    return popen([DDLSCALE, "run", *target.args, *args], target.env)


def finish(proc: "subprocess.Popen[str]", timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run(target: Target, *args: str) -> subprocess.CompletedProcess:
    return finish(start(target, *args))


def wait_for(path: Path, proc: "subprocess.Popen[str]", timeout: float = START_TIMEOUT) -> None:
    """Wait until the child created ``path`` (it runs), failing early if ddlscale already exited."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            result = finish(proc)
            pytest.fail(f"ddlscale exited with {result.returncode} before the command ran:\n{result.stderr}")
        assert time.monotonic() < deadline, f"the command did not start within {timeout}s"
        time.sleep(0.05)


CHECK_DASK = """
import os, sys
from distributed import Client
address = f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}"
with Client(address, timeout=30) as client:
    workers = len(client.scheduler_info()["workers"])
    total = client.submit(sum, range(10)).result()
print(f"WORKERS {workers} TOTAL {total}")
"""


@pytest.mark.slow
def test_local_command_runs_on_the_scaled_cluster_then_it_is_removed(local_target):
    result = run(local_target, "--replicas", "2", "--timeout", "120", "--", sys.executable, "-c", CHECK_DASK)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "WORKERS 2 TOTAL 45"  # stdout is the command's alone
    assert "2 workers registered with the Dask scheduler" in result.stderr  # framework readiness ran
    # The restore is reported once: the phase's summary line, as a flow prints it, with no timestamp.
    restored = [line for line in result.stderr.splitlines() if "restored to" in line]
    assert len(restored) == 1 and restored[0].startswith("run: dask/runner 0 -> 2 workers ready in"), result.stderr
    assert restored[0].endswith("restored to 0 workers (as found)")
    assert local_target.size() == 0


@pytest.mark.slow
def test_local_run_asking_for_fewer_workers_than_up_made_keeps_them(local_target, tmp_path):
    """``ddlscale local up --replicas 2``, then ``run --replicas 1``: at least 1, so the 2 stay, during and after."""
    up = subprocess.run([DDLSCALE, "local", "up", "--kind", "dask", "--name", "runner", "--replicas", "2"],
                        env=local_target.env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=START_TIMEOUT)
    assert up.returncode == 0, up.stderr
    result = run(local_target, "--replicas", "1", "--timeout", "120", "--", sys.executable, "-c", CHECK_DASK)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "WORKERS 2 TOTAL 45"  # the command ran on the 2 workers found
    # What the cluster has, not what the command asked for (this said "ready with 1 worker").
    assert "dask/runner ready: 2 workers up, held at 2 (this command needs at least 1)" in result.stderr
    assert "restored to 2 workers (as found)" in result.stderr
    assert local_target.size() == 2


@pytest.mark.slow
def test_local_run_with_fail_on_fault_stops_the_command_when_a_worker_is_lost(local_target, tmp_path):
    from flytekitplugins_ddlscale.backends.local import LocalBackend
    from flytekitplugins_ddlscale.refs import ClusterRef

    backend = LocalBackend(state_dir=Path(local_target.env["DDLSCALE_STATE_DIR"]) / "local")
    started = tmp_path / "started"
    proc = start(local_target, "--replicas", "2", "--timeout", "120", "--fail-on-fault", "--",
                 "sh", "-c", WAIT_FOR_SIGNAL, str(started))
    wait_for(started, proc)
    os.kill(backend.store.load(ClusterRef("dask", "runner")).workers[0].proc.pid, signal.SIGKILL)
    result = finish(proc)
    assert result.returncode == 6, result.stderr
    assert started.with_suffix(".got").read_text().strip() == "TERM"  # the command was stopped
    assert "[cluster_fault]" in result.stderr and "has 1 of its 2 workers up (1 lost)" in result.stderr
    assert "a cluster fault failed the run: the command was stopped (exit 143)" in result.stderr
    assert "(ClusterFaultError)" in result.stderr and "the phase was failed (fail_on_fault)" in result.stderr
    assert local_target.size() == local_target.baseline


def _until(what: str, check: Callable[[], bool], timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never saw {what} within {timeout}s"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_stopped_run_that_lost_its_claim_claims_again_or_with_fail_on_fault_stops(local_target, tmp_path):
    """Two runs hold 3 workers with a 4 s lease; both are stopped (SIGSTOP) past it while a third run
    drops their lapsed claims and shrinks the cluster; then both go on (SIGCONT). The plain run claims
    again, brings the cluster back to 3 before its command goes on, and says so; the one with
    --fail-on-fault stops its command and exits 6. Each step waits for what it needs to see happen."""
    from flytekitplugins_ddlscale.backends.local import LocalBackend
    from flytekitplugins_ddlscale.refs import ClusterRef

    backend = LocalBackend(state_dir=Path(local_target.env["DDLSCALE_STATE_DIR"]) / "local")
    ref = ClusterRef("dask", "runner")
    backend.up(ref, 1, timeout=120)
    plain_started, plain_go, failing_started = tmp_path / "plain", tmp_path / "go", tmp_path / "failing"
    holding = ("--replicas", "3", "--timeout", "120", "--no-framework-ready", "--lease-seconds", "4")
    plain = start(local_target, *holding, "--", "sh", "-c", "touch $0; while [ ! -e $1 ]; do sleep 0.05; done",
                  str(plain_started), str(plain_go))
    failing = start(local_target, *holding, "--fail-on-fault", "--", "sh", "-c", WAIT_FOR_SIGNAL,
                    str(failing_started))
    try:
        wait_for(plain_started, plain)
        wait_for(failing_started, failing)
        assert local_target.size() == 3 and len(backend.claims(ref)) == 2
        stop_outside_locks(plain.pid)
        stop_outside_locks(failing.pid)
        _until("both stopped runs' claims lapse", lambda: backend.claims(ref) == {})
        other = run(local_target, "--replicas", "1", "--timeout", "120", "--no-framework-ready", "--", "true")
        assert other.returncode == 0, other.stderr
        assert other.stderr.count("(3 workers, holder ") == 2, other.stderr  # it dropped both lapsed claims
        assert local_target.size() == 1  # and shrank the cluster below the stopped runs' 3
    finally:
        plain.send_signal(signal.SIGCONT)
        failing.send_signal(signal.SIGCONT)
    _until("the plain run's cluster back at 3", lambda: local_target.size() == 3 and plain.poll() is None)
    plain_go.touch()
    plain_result, failing_result = finish(plain), finish(failing)
    assert plain_result.returncode == 0, plain_result.stderr
    assert "lapsed: this process did not run or could not renew it" in plain_result.stderr
    assert "claimed again and the cluster brought back to its size" in plain_result.stderr  # the summary
    assert failing_result.returncode == 6, failing_result.stderr
    assert failing_started.with_suffix(".got").read_text().strip() == "TERM"  # its command was stopped
    assert "[cluster_fault]" in failing_result.stderr and "lapsed" in failing_result.stderr
    assert local_target.size() == 1 and backend.claims(ref) == {}


@pytest.mark.slow
def test_a_killed_run_s_workers_are_given_back_by_the_cluster_s_own_watch(local_target, tmp_path):
    """A lone ``run --replicas 4`` killed with SIGKILL (its command dies with it) on a cluster of 1:
    nobody else comes, and the scheduler's watch gives back its 3 workers."""
    from flytekitplugins_ddlscale.backends.local import LocalBackend
    from flytekitplugins_ddlscale.refs import ClusterRef

    backend = LocalBackend(state_dir=Path(local_target.env["DDLSCALE_STATE_DIR"]) / "local")
    ref = ClusterRef("dask", "runner")
    backend.up(ref, 1, timeout=120)
    started = tmp_path / "started"
    proc = start(local_target, "--replicas", "4", "--timeout", "120", "--no-framework-ready", "--",
                 "sh", "-c", WAIT_FOR_SIGNAL, str(started))
    wait_for(started, proc)
    assert local_target.size() == 4
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    _until("the cluster given back to the 1 worker it had", lambda: local_target.size() == 1)
    _until("the dead run's claim dropped from the record", lambda: backend.dead_claims(ref) == {})
    log = (backend.store.cluster_dir(ref) / "logs").glob("scheduler*")
    assert any("their holder is gone; giving back what they held" in path.read_text() for path in log)


def test_status_gives_back_what_a_killed_run_held_and_says_so(scaler_server, scaler_target, tmp_path):
    started = tmp_path / "started"
    proc = start(scaler_target, "--replicas", "3", "--timeout", "60", "--no-framework-ready", "--",
                 "sh", "-c", WAIT_FOR_SIGNAL, str(started))
    wait_for(started, proc)
    assert scaler_target.size() == 3
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    shown = subprocess.run([DDLSCALE, "status", *scaler_target.args], env=scaler_target.env, capture_output=True,
                           text=True, timeout=START_TIMEOUT)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"dropped claim run-\w+ \(3 workers, holder \S+\): its holder process \S+ is gone", shown.stderr)
    assert "gave back what run-" in shown.stderr and "the cluster is set to 1 workers" in shown.stderr
    assert scaler_target.size() == 1 and "claims: none" in shown.stdout


@pytest.mark.slow
def test_list_and_status_say_what_a_dead_claim_still_holds(local_target, tmp_path):
    from flytekitplugins_ddlscale.backends.local import LocalBackend
    from flytekitplugins_ddlscale.refs import ClusterRef

    backend = LocalBackend(state_dir=Path(local_target.env["DDLSCALE_STATE_DIR"]) / "local")
    ref = ClusterRef("dask", "runner")
    backend.up(ref, 1, timeout=120)
    # This process holds it while the cluster grows to it (a lease the reconcile cannot outlast, however
    # slow the machine: a lapsed claim would be dropped by it), then claims it once more on a short lease
    # and stops renewing: the watch leaves it (its holder runs), its lease runs out.
    backend.claim(ref, "run-stalled", 2, lease_seconds=600)
    backend.reconcile(ref, timeout=120)
    backend.claim(ref, "run-stalled", 2, lease_seconds=0.5)
    _until("the claim's lease to run out", lambda: "run-stalled" in backend.dead_claims(ref))
    for verb in ("list", "status --name runner"):
        shown = subprocess.run([DDLSCALE, "local", *verb.split()], env=local_target.env, capture_output=True,
                               text=True, timeout=START_TIMEOUT)
        assert shown.returncode == 0, shown.stderr
        assert "2 workers, 2 held by a run that stopped renewing at " in shown.stdout, shown.stdout
    assert local_target.size() == 2  # list and local status only report


def test_scaler_command_sees_the_cluster_at_its_size(scaler_server, scaler_target, tmp_path):
    seen = tmp_path / "seen"
    script = f"import json, urllib.request; print('child ran', flush=True); open({str(seen)!r}, 'w').write('x')"
    result = run(scaler_target, "--replicas", "3", "--timeout", "30", "--", sys.executable, "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "child ran\n" and seen.exists()
    bodies = [r.body for r in scaler_server.requests if r.method == "PATCH"]
    assert [b["replicas"] for b in bodies] == [3, 1]  # scaled for the command, then back to the baseline
    assert scaler_target.size() == 1


FLYTEKIT_IMPORT = re.compile(r"^import time:.*\|\s*flytekit(\.\w+)*\s*$", re.MULTILINE)
"""A ``-X importtime`` line for flytekit or one of its modules (not this plugin's package)."""


def test_a_run_never_imports_flytekit(scaler_server, scaler_target):
    # The whole phase (claim, scale, wait, release, restore) runs in this process;
    # flytekit costs about 2 s to import and none of it is Flyte.
    argv = [sys.executable, "-X", "importtime", DDLSCALE, "run", *scaler_target.args, "--replicas", "2",
            "--timeout", "30", "--", "true"]
    result = finish(popen(argv, scaler_target.env))
    assert result.returncode == 0, result.stderr
    assert "import time:" in result.stderr and "flytekitplugins_ddlscale._services.hold" in result.stderr
    assert FLYTEKIT_IMPORT.findall(result.stderr) == []
    assert [r.body["replicas"] for r in scaler_server.requests if r.method == "PATCH"] == [2, 1]


def test_failing_command_exit_code_is_passed_through_and_cluster_restored(target):
    result = run(target, "--replicas", "2", "--timeout", "120", "--", "sh", "-c", "echo failing; exit 7")
    assert result.returncode == 7, result.stderr
    assert result.stdout == "failing\n"
    assert "command exited with 7" in result.stderr
    assert "failed (exit 7) after" in result.stderr and "done after" not in result.stderr
    assert target.size() == target.baseline


def test_sigterm_reaches_the_command_and_cluster_is_restored(target, tmp_path):
    started = tmp_path / "started"
    proc = start(target, "--replicas", "2", "--timeout", "120", "--", "sh", "-c", WAIT_FOR_SIGNAL, str(started))
    wait_for(started, proc)
    assert target.size() == 2
    proc.send_signal(signal.SIGTERM)
    result = finish(proc)
    assert result.returncode == 143, result.stderr
    assert started.with_suffix(".got").read_text().strip() == "TERM"
    assert "SIGTERM received: passing it on to the command" in result.stderr
    assert target.size() == target.baseline


def test_sigint_is_forwarded_when_no_terminal_delivered_it(scaler_target, tmp_path):
    started = tmp_path / "started"
    proc = start(scaler_target, "--replicas", "2", "--timeout", "30", "--", "sh", "-c", WAIT_FOR_SIGNAL, str(started))
    wait_for(started, proc)
    proc.send_signal(signal.SIGINT)
    result = finish(proc)
    assert result.returncode == 130, result.stderr
    assert started.with_suffix(".got").read_text().strip() == "INT"
    assert scaler_target.size() == 1


def test_command_ignoring_sigterm_is_killed_after_the_grace_then_restored(scaler_target, tmp_path):
    started = tmp_path / "started"
    stubborn = 'trap "" TERM; touch $0; while :; do sleep 0.05; done'
    proc = start(
        scaler_target, "--replicas", "2", "--timeout", "30", "--kill-after", "0.5", "--",
        "sh", "-c", stubborn, str(started),
    )
    wait_for(started, proc)
    proc.send_signal(signal.SIGTERM)
    result = finish(proc)
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert "did not exit within 0.5s of the signal; killing it" in result.stderr
    assert scaler_target.size() == 1


def test_sigterm_during_scale_up_restores_and_never_runs_the_command(scaler_server, scaler_target, tmp_path):
    scaler_server.set_pod_ready_delay(60, kind="ray", name="ray-run1")
    started = tmp_path / "started"
    proc = start(scaler_target, "--replicas", "3", "--timeout", "120", "--", "touch", str(started))
    deadline = time.monotonic() + START_TIMEOUT
    while scaler_server.count("PATCH") == 0:
        assert proc.poll() is None and time.monotonic() < deadline, "the scale-up request never came"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    result = finish(proc)
    assert result.returncode == 143, result.stderr
    assert "SIGTERM before the command started; ray/ray-run1 restored to 1 worker (as found)" in result.stderr
    assert not started.exists()
    assert scaler_target.size() == 1


def test_scale_timeout_exits_3_without_running_the_command(scaler_server, scaler_target, tmp_path):
    scaler_server.set_pod_ready_delay(60, kind="ray", name="ray-run1")
    started = tmp_path / "started"
    result = run(scaler_target, "--replicas", "3", "--timeout", "1", "--", "touch", str(started))
    assert result.returncode == 3, result.stderr
    assert "Error: [timeout]" in result.stderr and "the command did not run" in result.stderr
    assert not started.exists()
    assert scaler_target.size() == 1


def test_command_not_found_exits_127_and_restores(scaler_target):
    result = run(scaler_target, "--replicas", "2", "--timeout", "30", "--", "no-such-command-ddlscale")
    assert result.returncode == 127, result.stderr
    assert "cannot run 'no-such-command-ddlscale'" in result.stderr
    assert scaler_target.size() == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas", "-1"], "invalid replicas=-1"),
        (["--replicas", "2", "--timeout", "0"], "invalid timeout=0.0"),
        (["--replicas", "2", "--kill-after", "0"], "invalid kill_after=0.0"),
        (["--replicas", "2", "--worker-hw-tier", "  "], "invalid worker_hw_tier='  '"),
        (["--replicas", "two"], "'two' is not a valid integer"),
        (["--replicas", "2", "--backend", "bogus"], "invalid backend='bogus'; allowed: kubernetes, local, scaler"),
    ],
)
def test_bad_input_is_refused_before_anything_changes(target, tmp_path, args, message):
    started = tmp_path / "started"
    result = run(target, *args, "--", "touch", str(started))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not started.exists()
    assert target.requests() == 0 and target.size() == target.baseline


def test_unknown_local_tier_names_the_allowed_tiers(local_target, tmp_path):
    started = tmp_path / "started"
    result = run(local_target, "--replicas", "1", "--worker-hw-tier", "Huge", "--", "touch", str(started))
    assert result.returncode == 2, result.stderr
    assert "allowed for dask: Large, Medium, Small" in result.stderr
    assert not started.exists() and local_target.requests() == 0


def test_missing_command_and_missing_cluster_name(scaler_server, scaler_target):
    no_command = finish(popen([DDLSCALE, "run", *scaler_target.args, "--replicas", "2"], scaler_target.env))
    assert no_command.returncode == 2 and "Missing argument 'COMMAND...'" in no_command.stderr
    no_name = finish(popen([DDLSCALE, "run", "--kind", "ray", "--replicas", "2", "--", "true"], scaler_target.env))
    assert no_name.returncode == 2
    assert "give --name (or --run-id) outside a Domino run" in no_name.stderr
    assert scaler_server.count("PATCH") == 0


def test_exit_status_of_a_signalled_child():
    from flytekitplugins_ddlscale.cli.child import exit_status

    assert [exit_status(0), exit_status(7), exit_status(-signal.SIGTERM)] == [0, 7, 143]


def test_run_in_a_domino_run_uses_the_runs_own_cluster(scaler_server, scaler_target):
    scaler_server.add_cluster("dask", "dask-abc123", replicas=1, max_replicas=4)
    env = dict(scaler_target.env, DOMINO_RUN_ID="abc123")
    result = finish(popen([DDLSCALE, "run", "--kind", "dask", "--replicas", "2", "--timeout", "30", "--", "true"], env))
    assert result.returncode == 0, result.stderr
    assert "restored to 1 worker (as found)" in result.stderr and "1 workers" not in result.stderr
    assert scaler_server.cluster_object("dask", "dask-abc123")["spec"]["worker"]["replicas"] == 1
    assert scaler_server.count("PATCH", "daskclusters/dask-abc123") == 2


def _bash_blocks(markdown: Path) -> List[str]:
    text = markdown.read_text(encoding="utf-8")
    return [block.split("```", 1)[0] for block in text.split("```bash\n")[1:]]


@pytest.mark.parametrize("block", [0, 1], ids=["job-command", "pre-warmed"])
def test_domino_flows_job_commands_run_as_documented(scaler_server, scaler_target, tmp_path, block):
    """The job scripts in examples/domino_flows_job.md, run by bash against the scaler test server."""
    scaler_server.add_cluster("ray", "ray-abc123", replicas=1, max_replicas=8)
    script = _bash_blocks(Path(__file__).resolve().parent.parent / "examples" / "domino_flows_job.md")[block]
    assert "ddlscale run" in script and "trap" not in script
    (tmp_path / "run_training.sh").write_text("set -euo pipefail\n" + script, encoding="utf-8")
    (tmp_path / "train.py").write_text("import sys; print('trained', sys.argv[1:])\n", encoding="utf-8")
    (tmp_path / "prepare.py").write_text("print('prepared')\n", encoding="utf-8")
    env = dict(scaler_target.env, DOMINO_RUN_ID="abc123",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(["bash", "run_training.sh", "--epochs", "1"], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=START_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == ("trained ['--epochs', '1']" if block == 0 else "trained []")
    patches = [r.body["replicas"] for r in scaler_server.requests if r.method == "PATCH"]
    size = lambda: scaler_server.cluster_object("ray", "ray-abc123")["spec"]["worker"]["replicas"]  # noqa: E731
    if block == 0:
        assert patches == [8, 1]  # scaled for the step, back to the size it found after it
        assert size() == 1
        return
    # The run gives back what it found (the pre-warm's 8); the baseline the pre-warm recorded stays.
    assert set(patches) == {8} and size() == 8
    restored = subprocess.run([DDLSCALE, "restore", "--kind", "ray", "--run-id", "abc123", "--timeout", "30"], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=START_TIMEOUT)
    assert restored.returncode == 0, restored.stderr
    assert size() == 1


def test_ctrl_c_on_a_terminal_reaches_the_command_once(scaler_target, tmp_path):
    """Ctrl-C signals the terminal's whole foreground group; ddlscale must not send the command a second SIGINT."""
    import fcntl
    import pty
    import termios

    started = tmp_path / "started"
    # Counts SIGINTs as they arrive, and keeps listening for a second after the first.
    counting = (
        "import pathlib, signal, sys, time\n"
        "got = pathlib.Path(sys.argv[1] + '.got')\n"
        "signal.signal(signal.SIGINT, lambda *_: got.open('a').write('INT\\n'))\n"
        "pathlib.Path(sys.argv[1]).touch()\n"
        "while not got.exists(): time.sleep(0.01)\n"
        "ends = time.monotonic() + 1\n"
        "while time.monotonic() < ends: time.sleep(0.01)\n"
        "sys.exit(130)\n"
    )
    master, slave = pty.openpty()

    def take_the_terminal() -> None:  # runs in the child: a new session whose controlling terminal is the pty
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [DDLSCALE, "run", *scaler_target.args, "--replicas", "2", "--timeout", "30", "--",
         sys.executable, "-c", counting, str(started)],
        env=scaler_target.env, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=take_the_terminal,
    )
    os.close(slave)
    try:
        wait_for(started, proc)
        os.write(master, b"\x03")  # what Ctrl-C types
        result = finish(proc)
    finally:
        os.close(master)
    assert result.returncode == 130, result.stderr
    assert started.with_suffix(".got").read_text().split() == ["INT"]
    assert "the terminal sent it to the command as well" in result.stderr
    assert scaler_target.size() == 1


def test_failed_restore_after_a_successful_command_exits_with_the_restore_code(scaler_server, scaler_target, tmp_path):
    started = tmp_path / "started"
    held = 'touch $0; while [ ! -e $0.release ]; do sleep 0.05; done'
    proc = start(scaler_target, "--replicas", "2", "--timeout", "30", "--", "sh", "-c", held, str(started))
    wait_for(started, proc)
    scaler_server.inject_faults("status", count=1000, status=503, method="PATCH")
    started.with_suffix(".release").touch()
    result = finish(proc)
    assert result.returncode == 6, result.stderr  # backend unavailable: the command's 0 would hide it
    assert "the command exited with 0, but restoring ray/ray-run1 failed" in result.stderr
    assert scaler_target.size() == 2
    scaler_server.clear_faults()
    recovered = subprocess.run(
        [DDLSCALE, "restore", *scaler_target.args, "--timeout", "30"], env=scaler_target.env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=START_TIMEOUT,
    )
    assert recovered.returncode == 0, recovered.stderr  # the baseline was kept for exactly this
    assert scaler_target.size() == 1


def test_ctrl_c_during_a_scale_wait_exits_130(scaler_server, scaler_target):
    scaler_server.set_pod_ready_delay(60.0)
    proc = popen([DDLSCALE, "scale", *scaler_target.args, "--replicas", "3", "--wait", "--timeout", "60"],
                 scaler_target.env)
    deadline = time.monotonic() + START_TIMEOUT
    while scaler_target.requests() == 0:  # the scale request was sent: the command is waiting
        assert proc.poll() is None and time.monotonic() < deadline, "ddlscale scale never sent its request"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    result = finish(proc)
    assert result.returncode == 130, result.stderr
    assert "Interrupted." in result.stderr and "Aborted!" not in result.stderr


@pytest.mark.slow
def test_a_piped_scale_wait_keeps_talking_while_nothing_changes(scaler_server, scaler_target):
    scaler_server.set_pod_ready_delay(17.0)  # longer than the 15 s a piped wait may stay silent
    result = finish(popen([DDLSCALE, "scale", *scaler_target.args, "--replicas", "2", "--wait", "--timeout", "60"],
                          scaler_target.env))
    assert result.returncode == 0, result.stderr
    heartbeats = [line for line in result.stderr.splitlines() if "still waiting for" in line]
    assert heartbeats and "1/2 after" in heartbeats[0] and "(timeout 60s)" in heartbeats[0], result.stderr


def test_a_command_that_needs_no_workers_runs_on_a_local_cluster_that_does_not_exist(local_target):
    result = run(local_target, "--replicas", "0", "--", "sh", "-c", "echo ran")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran\n"
    assert local_target.requests() == 0  # no cluster was created for it


def test_a_claim_removed_before_the_scale_is_a_conflict_and_the_command_does_not_run(scaler_target, tmp_path):
    """``ddlscale restore`` between a run's claim and its scale drops the claim: the run stops with a
    ConflictError saying so, runs nothing and leaves the cluster at its size."""
    started = tmp_path / "started"
    pause = Pause("claimed")
    proc = pause.popen(["run", *scaler_target.args, "--replicas", "3", "--timeout", "30", "--", "touch", str(started)],
                       env=scaler_target.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    try:
        assert pause.wait(START_TIMEOUT), finish(proc).stderr
        restored = subprocess.run([DDLSCALE, "restore", *scaler_target.args], env=scaler_target.env,
                                  capture_output=True, text=True, timeout=START_TIMEOUT)
        assert restored.returncode == 0, restored.stderr
        pause.resume()
        result = finish(proc)
    finally:
        pause.close()
    assert result.returncode == 1, result.stderr
    assert "Error: [conflict]" in result.stderr and "vanished before the cluster was scaled" in result.stderr
    assert not started.exists()
    assert scaler_target.size() == 1
