"""Local clusters after ``kill -9`` of the command changing them, and with broken or unwritable state.

Real ``ddlscale`` processes are killed at chosen points through the pause
hooks (:mod:`tests.pause_support`: ``head-started``, ``worker-started``: a
process runs that ``cluster.json`` does not hold yet), never by luck of
timing; records are damaged by hand; the state directory is made read-only
or full on a real tmpfs (root only: a Dask scheduler's workers file left
stale by a full disk is written again once there is room). Afterwards
``/proc`` is scanned: no process of the state directory may be left running.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.local import LocalBackend
from flytekitplugins_ddlscale.backends.local._dask_watch import WORKERS_FILE
from tests.pause_support import Pause, kill_once_paused
from tests.test_local_support import processes_mentioning

pytestmark = pytest.mark.slow
DDLSCALE = str(Path(sys.executable).parent / "ddlscale")
REF = ClusterRef("dask", "crash")
SHORT_GRACE = "5"
"""``$DDLSCALE_WATCH_GRACE`` (seconds) of the tests that wait for an unrecorded scheduler to close itself: what
they prove is that it closes, not after how long, so they do not wait out the default 30 s. The other tests
keep the default, long enough that a scheduler they find unrecorded is still there when they look."""


@pytest.fixture
def state(tmp_path):
    """``$DDLSCALE_STATE_DIR`` of the test (local clusters in ``<it>/local``); afterwards no process of it runs."""
    root = tmp_path / "state"
    yield root
    if (root / "local").exists():
        LocalBackend(state_dir=root / "local").shutdown_all()
    leftover = processes_mentioning(str(root), environment=True)
    assert leftover == [], f"processes left running: {leftover}"


def _env(root: Path, grace: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDLSCALE_")}
    env["DDLSCALE_STATE_DIR"] = str(root)
    if grace:  # inherited by the schedulers the command starts
        env["DDLSCALE_WATCH_GRACE"] = grace
    return env


def ddlscale(root: Path, *args: str, timeout: float = 180, grace: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([DDLSCALE, *args], env=_env(root, grace=grace), capture_output=True, text=True,
                          timeout=timeout)


def local(root: Path, *args: str, grace: str = "") -> subprocess.CompletedProcess:
    return ddlscale(root, "local", *args, grace=grace)


def killed_at(root: Path, point: str, *args: str, grace: str = "") -> None:
    """Run ``ddlscale *args`` until it pauses at ``point``, then SIGKILL it."""
    pause = Pause(point)
    proc = pause.popen(list(args), env=_env(root, grace), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kill_once_paused(proc, pause)


def listed(root: Path) -> dict:
    ran = local(root, "list", "--json")
    assert ran.returncode == 0, ran.stderr
    return {info["cluster"]: info for info in json.loads(ran.stdout)}


def test_up_killed_after_its_scheduler_started_leaves_nothing_down_cannot_find(state):
    killed_at(state, "head-started", "local", "up", "--name", REF.name, "--replicas", "2", "--timeout", "120")
    running = processes_mentioning(str(state), environment=True)
    assert len(running) == 1  # the scheduler, never recorded
    info = listed(state)[str(REF)]
    assert info["scheduler_pid"] is None and info["unrecorded_pids"] == running
    assert info["status"] == "Interrupted" and info["pending"]["desired"] == 2
    text = local(state, "list")
    assert "1 process not recorded" in text.stdout and "Interrupted" in text.stdout, text.stdout
    down = local(state, "down", "--name", REF.name)
    assert down.returncode == 0, down.stderr
    assert f"1 process its record did not hold (pids {running[0]})" in down.stdout
    assert processes_mentioning(str(state), environment=True) == []
    assert listed(state) == {}


def test_scale_killed_mid_worker_start_then_down_stops_every_process(state):
    assert local(state, "up", "--name", REF.name, "--replicas", "1", "--timeout", "120").returncode == 0
    killed_at(state, "worker-started", "scale", "--backend", "local", "--kind", "dask", "--name", REF.name,
              "--replicas", "4", "--timeout", "120", "--no-framework-check")
    info = listed(state)[str(REF)]
    assert len(info["workers"]) == 1 and len(info["unrecorded_pids"]) == 1  # the new worker, not yet recorded
    assert info["status"] == "Interrupted" and info["pending"]["desired"] == 4
    down = local(state, "down", "--name", REF.name)
    assert down.returncode == 0, down.stderr
    assert "found 2 recorded processes running, and 1 process its record did not hold" in down.stdout, down.stdout
    assert processes_mentioning(str(state), environment=True) == []


def test_an_unrecorded_worker_is_stopped_by_the_next_change_and_by_down(state):
    """The window that matters: a worker started and not yet recorded. The next change stops it
    before it changes anything; a repair refuses the half-written record instead of acting on it."""
    assert local(state, "up", "--name", REF.name, "--replicas", "1", "--timeout", "120").returncode == 0
    backend = LocalBackend(state_dir=state / "local")
    recorded_before = {w.proc.pid for w in backend.store.load(REF).workers}
    killed_at(state, "head-started", "local", "up", "--name", "other", "--replicas", "1", "--timeout", "120")
    # A worker of REF started and not recorded: kill `up --replicas 3` right after its first new worker.
    killed_at(state, "worker-started", "local", "up", "--name", REF.name, "--replicas", "3", "--timeout", "120")
    record = backend.store.load(REF)
    assert record.pending is not None and record.pending.desired == 3 and record.desired == 1
    status = local(state, "status", "--name", REF.name, "--repair", "--timeout", "60")
    assert status.returncode == 1, status.stdout + status.stderr
    assert "interrupted half-way" in status.stderr and "ddlscale local up --kind dask --name crash" in status.stderr
    assert {w.proc.pid for w in backend.store.load(REF).workers} >= recorded_before  # nothing stopped
    up = local(state, "up", "--name", REF.name, "--replicas", "3", "--timeout", "120", "--json")
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    assert (info["ready_workers"], info["pending"], info["unrecorded_pids"]) == (3, None, [])
    mine = set(processes_mentioning(str(backend.store.cluster_dir(REF)), environment=True))
    assert mine == {info["scheduler_pid"], *(w["pid"] for w in info["workers"])}
    listing = listed(state)
    assert listing[str(ClusterRef("dask", "other"))]["status"] == "Interrupted"
    down = local(state, "down", "--all")
    assert down.returncode == 0 and "stopped 2 clusters" in down.stdout, down.stdout
    assert processes_mentioning(str(state), environment=True) == []


@pytest.mark.parametrize("damage", ["", '{"kind": "dask", "name": "cra', "[1, 2]", '{"port": "x"}'])
def test_a_corrupt_cluster_record_is_listed_as_corrupt_and_down_still_works(state, damage):
    assert local(state, "up", "--name", REF.name, "--replicas", "1", "--timeout", "120").returncode == 0
    assert local(state, "up", "--name", "healthy", "--replicas", "1", "--timeout", "120").returncode == 0
    backend = LocalBackend(state_dir=state / "local")
    path = backend.store.record_path(REF)
    running = set(processes_mentioning(str(backend.store.cluster_dir(REF)), environment=True))
    assert len(running) == 2
    path.write_text(damage)
    for args in (["status", "--name", REF.name], ["status", "--name", REF.name, "--repair"]):
        ran = local(state, *args)
        assert ran.returncode == 2 and str(path) in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
        assert "`ddlscale local down --kind dask --name crash` stops every process" in ran.stderr
    scale = ddlscale(state, "scale", "--backend", "local", "--kind", "dask", "--name", REF.name, "--replicas", "2")
    assert scale.returncode == 2 and str(path) in scale.stderr and "Traceback" not in scale.stderr, scale.stderr
    listing = listed(state)
    assert listing[str(REF)]["status"] == "Corrupt" and str(path) in listing[str(REF)]["error"]
    assert set(listing[str(REF)]["unrecorded_pids"]) == running
    assert listing[str(ClusterRef("dask", "healthy"))]["status"] == "Running"
    down = local(state, "down", "--name", REF.name)
    assert down.returncode == 0, down.stderr
    assert "2 processes its record did not hold" in down.stdout
    assert not path.exists() and not set(processes_mentioning(str(backend.store.cluster_dir(REF)), environment=True))
    assert list(listed(state)) == [str(ClusterRef("dask", "healthy"))]


def test_a_corrupt_baseline_record_is_named_and_down_removes_it(state):
    assert ddlscale(state, "scale", "--backend", "local", "--kind", "dask", "--name", REF.name, "--replicas", "1",
                    "--no-framework-check", "--create").returncode == 0
    records = state / "local" / "records" / f"_.dask.{REF.name}.json"
    assert records.exists()
    records.write_text('{"baseline": ')
    for args in (["scale", "--replicas", "2"], ["restore"]):
        ran = ddlscale(state, *args[:1], "--backend", "local", "--kind", "dask", "--name", REF.name, *args[1:])
        assert ran.returncode == 2 and str(records) in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    down = local(state, "down", "--name", REF.name)
    assert down.returncode == 0, down.stderr
    assert not records.exists()
    assert processes_mentioning(str(state), environment=True) == []


@pytest.fixture
def tmpfs(tmp_path):
    """A 2 MiB tmpfs mounted at a fresh folder (root only; skipped where mounting is not possible)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(mount)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)


def _temp_files(folder: Path) -> list:
    return [p for p in folder.rglob(".tmp-*")]


def _make_unwritable(fault: str, root: Path, tmpfs: Path) -> None:
    if fault == "read-only":
        # A read-only bind mount over the state folder: the running processes keep their logs open
        # on the writable mount below, so the tmpfs itself cannot be remounted read-only.
        subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(root)], check=True)
    else:
        with open(tmpfs / "filler", "wb") as handle:
            with pytest.raises(OSError):
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()


def _make_writable(fault: str, root: Path, tmpfs: Path) -> None:
    if fault == "read-only":
        # Not os.path.ismount: a bind mount of the same file system has the same device.
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
    elif (tmpfs / "filler").exists():
        os.unlink(tmpfs / "filler")


@pytest.mark.parametrize("when", ["before", "mid-change"])
@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_an_unwritable_state_dir_is_a_typed_answer_and_leaves_no_unrecorded_process(tmpfs, fault, when):
    """``before``: the state directory is unwritable when ``up 1 -> 3`` starts; ``mid-change``: it becomes
    so while ``up`` is paused with its first new worker started and not yet recorded, then ``up`` goes
    on. Either way: exit 8 naming the file and the remedy, no ``.tmp-*`` file, and exactly the processes
    the record holds running."""
    root = tmpfs / "state"
    try:
        assert local(root, "up", "--name", REF.name, "--replicas", "1", "--timeout", "120").returncode == 0
        backend = LocalBackend(state_dir=root / "local")
        before = backend.store.load(REF)
        command = [DDLSCALE, "local", "up", "--name", REF.name, "--replicas", "3", "--timeout", "60"]
        if when == "before":
            _make_unwritable(fault, root, tmpfs)
            ran = subprocess.run(command, env=_env(root), capture_output=True, text=True, timeout=180)
            out, err, code = ran.stdout, ran.stderr, ran.returncode
        else:
            pause = Pause("worker-started")
            proc = pause.popen(command[1:], env=_env(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                assert pause.wait(120), proc.communicate(timeout=30)
                assert len(processes_mentioning(str(backend.store.cluster_dir(REF)), environment=True)) == 3
                _make_unwritable(fault, root, tmpfs)
                pause.resume()
                out, err = proc.communicate(timeout=180)
            finally:
                pause.close()
            code = proc.returncode
        assert code == 8, out + err
        assert "could not write" in err and "Traceback" not in err, err
        assert ("read-only" if fault == "read-only" else "no space left") in err
        assert _temp_files(root) == []
        running = set(processes_mentioning(str(backend.store.cluster_dir(REF)), environment=True))
        assert running == {before.scheduler.pid, *(w.proc.pid for w in before.workers)}
        record = backend.store.load(REF)
        assert running == {record.scheduler.pid, *(w.proc.pid for w in record.workers)}
        # `down` stops every process even while the folder cannot be written; what it cannot remove it
        # names (read-only: exit 8; a full disk lets files be removed).
        down = local(root, "down", "--name", REF.name)
        assert down.returncode == (8 if fault == "read-only" else 0), down.stdout + down.stderr
        assert "Traceback" not in down.stderr
        assert processes_mentioning(str(root), environment=True) == []
        _make_writable(fault, root, tmpfs)
        if fault == "read-only":
            assert local(root, "down", "--name", REF.name).returncode == 0
        assert listed(root) == {}
    finally:
        _make_writable(fault, root, tmpfs)
        if (root / "local").exists():
            LocalBackend(state_dir=root / "local").shutdown_all()


def test_a_workers_file_a_full_disk_kept_stale_is_written_again_once_there_is_room(tmpfs):
    """The disk is full when a worker dies: the scheduler cannot rewrite ``dask-workers.json``, which still lists
    the dead worker; once there is room its watch writes it again, as the scheduler sees the workers."""
    from tests.test_local_support import scheduler_workers, wait_dead

    root = tmpfs / "state"
    try:
        up = local(root, "up", "--name", REF.name, "--replicas", "2", "--timeout", "120")
        assert up.returncode == 0, up.stdout + up.stderr
        backend = LocalBackend(state_dir=root / "local")
        record, folder = backend.store.load(REF), backend.store.cluster_dir(REF)
        path = folder / WORKERS_FILE
        gone, kept = record.workers
        _make_unwritable("full", root, tmpfs)
        os.kill(gone.proc.pid, signal.SIGKILL)
        wait_dead(gone.proc)
        deadline = time.monotonic() + 120
        while gone.name in scheduler_workers(record.address, folder):  # until the scheduler has removed it
            assert time.monotonic() < deadline, "the scheduler still lists the killed worker"
            time.sleep(0.1)
        assert json.loads(path.read_text())["workers"] == sorted([gone.name, kept.name])  # no room to rewrite it
        _make_writable("full", root, tmpfs)
        while json.loads(path.read_text())["workers"] != [kept.name]:  # the watch's next look writes it
            assert time.monotonic() < deadline, path.read_text()
            time.sleep(0.1)
        assert backend.get_state(REF).ready_workers == 1
    finally:
        _make_writable("full", root, tmpfs)
        if (root / "local").exists():
            LocalBackend(state_dir=root / "local").shutdown_all()


def _gone_within(root: Path, seconds: float) -> list:
    ends = time.monotonic() + seconds
    while processes_mentioning(str(root), environment=True) and time.monotonic() < ends:
        time.sleep(0.5)
    return processes_mentioning(str(root), environment=True)


def test_a_scheduler_no_record_holds_closes_itself(state):
    """``up`` killed right after its scheduler started (never recorded), and nobody runs ``down``: the
    scheduler closes itself within its grace (30 s by default; SHORT_GRACE here), instead of running on with no
    death timeout."""
    killed_at(state, "head-started", "local", "up", "--name", REF.name, "--replicas", "1", "--timeout", "120",
              grace=SHORT_GRACE)
    assert len(processes_mentioning(str(state), environment=True)) == 1
    assert _gone_within(state, 90) == []
    log = (state / "local" / "clusters" / f"_.dask.{REF.name}" / "logs" / "scheduler.log").read_text()
    assert f"no record of cluster {state / 'local' / 'clusters' / f'_.dask.{REF.name}'} holds this scheduler " \
           f"(for {SHORT_GRACE}s)" in log, log[-2000:]


def test_a_cluster_whose_folder_was_removed_stops_on_its_own(state):
    """The state directory removed under a running cluster: its scheduler closes itself, and its workers
    follow it (their death timeout)."""
    assert local(state, "up", "--name", REF.name, "--replicas", "1", "--timeout", "120",
                 grace=SHORT_GRACE).returncode == 0
    assert len(processes_mentioning(str(state), environment=True)) == 2
    subprocess.run(["rm", "-rf", str(state / "local" / "clusters")], check=True)
    assert _gone_within(state, 150) == []


def test_a_state_dir_made_read_only_mid_phase_is_a_typed_answer(tmpfs):
    """``ddlscale run --replicas 2`` paused with the cluster held at 2 (pause point ``scaled``), the state
    folder made read-only, then resumed: its release cannot be recorded. The answer is exit 8 naming the
    file and the remedy, no traceback, no ``.tmp-*`` file, and the processes running are the ones the
    record holds; once writable, ``ddlscale restore`` brings the baseline back."""
    root = tmpfs / "state"
    try:
        assert local(root, "up", "--name", REF.name, "--replicas", "1", "--timeout", "120").returncode == 0
        backend = LocalBackend(state_dir=root / "local")
        pause = Pause("scaled")
        command = ["run", "--backend", "local", "--kind", "dask", "--name", REF.name, "--replicas", "2",
                   "--timeout", "120", "--", "true"]
        proc = pause.popen(command, env=_env(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert pause.wait(120), proc.communicate(timeout=30)
            _make_unwritable("read-only", root, tmpfs)
            pause.resume()
            out, err = proc.communicate(timeout=180)
        finally:
            pause.close()
        assert proc.returncode == 8, out + err
        assert "could not write" in err and "read-only" in err and "Traceback" not in err, err
        assert _temp_files(root) == []
        record = backend.store.load(REF)
        running = set(processes_mentioning(str(backend.store.cluster_dir(REF)), environment=True))
        assert running == {record.scheduler.pid, *(w.proc.pid for w in record.workers)}
        _make_writable("read-only", root, tmpfs)
        restore = ddlscale(root, "restore", "--backend", "local", "--kind", "dask", "--name", REF.name)
        assert restore.returncode == 0, restore.stdout + restore.stderr
        assert backend.get_state(REF).desired_workers == 1
        assert local(root, "down", "--name", REF.name).returncode == 0
    finally:
        _make_writable("read-only", root, tmpfs)
        if (root / "local").exists():
            LocalBackend(state_dir=root / "local").shutdown_all()


def test_a_phase_waiting_on_a_frozen_worker_keeps_no_lock_from_another_run(state):
    """Run A scales 1 -> 2 and its new worker is frozen (SIGSTOP right after it started, at the pause
    point, so it never registers): A waits for it outside every lock, and run B, asking 1 worker with a
    short timeout, claims, runs its command and ends meanwhile. Thawed, the worker joins and A ends too."""
    assert local(state, "up", "--name", REF.name, "--replicas", "1", "--timeout", "120").returncode == 0
    before = set(processes_mentioning(str(state), environment=True))
    pause = Pause("worker-started")
    run_a = pause.popen(
        ["run", "--backend", "local", "--kind", "dask", "--name", REF.name, "--replicas", "2",
         "--timeout", "150", "--", "true"],
        env=_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    frozen = None
    try:
        assert pause.wait(120), "run A never started its new worker"
        new = sorted(set(processes_mentioning(str(state), environment=True)) - before - {run_a.pid})
        assert len(new) == 1, new
        frozen = new[0]
        os.kill(frozen, signal.SIGSTOP)
        pause.resume()
        run_b = ddlscale(state, "run", "--backend", "local", "--kind", "dask", "--name", REF.name, "--replicas", "1",
                         "--timeout", "20", "--", "true", timeout=120)
        assert run_b.returncode == 0, run_b.stderr
        assert run_a.poll() is None, "run A should still wait for its frozen worker"
        os.kill(frozen, signal.SIGCONT)
        frozen = None
        out, err = run_a.communicate(timeout=150)
        assert run_a.returncode == 0, err
    finally:
        pause.close()
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        if run_a.poll() is None:
            run_a.kill()
            run_a.communicate(timeout=30)
    assert local(state, "down", "--name", REF.name).returncode == 0
