"""Local backend against real Dask scheduler and worker processes.

Worker counts, threads and memory limits are checked through a real
``distributed.Client`` connected with the Domino connection variables, and
worker pids through ``Client.run(os.getpid)`` on the workers themselves.
``ddlscale local up`` counts the workers from the file the scheduler keeps
(``dask-workers.json``), without importing ``distributed``: checked in a
child process, against what the scheduler itself reports.
"""
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest

from flytekitplugins_ddlscale import (
    BackendUnavailableError,
    ClusterRef,
    ReplicaSpec,
    ScalingTimeoutError,
    WorkerFailedError,
)
from flytekitplugins_ddlscale.backends.local import LocalBackend, _procs as procs
from flytekitplugins_ddlscale.backends.local._dask_watch import WORKERS_FILE
from tests.test_local_support import (  # noqa: F401
    backend,
    descriptor_targets,
    local_state,
    processes_mentioning,
    scheduler_workers,
    tiers_file,
    wait_dead,
)

pytestmark = pytest.mark.slow


def _client_from_env():
    from distributed import Client

    return Client(
        f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}",
        timeout=10,
    )


def _recorded_worker_pids(backend, ref):
    return sorted(w.proc.pid for w in backend.store.load(ref).workers)


def test_scale_0_3_1_0_with_compute_on_the_workers(backend):
    ref = ClusterRef("dask", "cycle")
    three = backend.scale(ref, 3, wait=False)
    assert (three.effective, three.final.desired_workers, three.waited) == (3, 3, False)
    assert three.previous.desired_workers == 0
    reports = []
    state = backend.wait_for_workers(ref, 3, timeout=60, progress=reports.append)
    assert (state.ready_workers, state.existing_workers, state.status) == (3, 3, "Running")
    assert reports[-1].current == reports[-1].target == 3
    assert "3 workers seen by the Dask scheduler of dask/cycle" in reports[-1].what
    port_before = os.environ.get("DASK_SCHEDULER_SERVICE_PORT")
    with backend.connected(ref) as env:
        assert env["DASK_SCHEDULER_SERVICE_HOST"] == "127.0.0.1"
        with _client_from_env() as client:
            squares = client.gather(client.map(lambda x: x * x, range(20)))
            worker_pids = sorted(client.run(os.getpid).values())
    assert sum(squares) == sum(x * x for x in range(20))
    assert worker_pids == _recorded_worker_pids(backend, ref)
    assert os.environ.get("DASK_SCHEDULER_SERVICE_PORT") == port_before

    before = {w.name: w.proc for w in backend.store.load(ref).workers}
    one = backend.scale(ref, 1, timeout=60)
    assert (one.final.desired_workers, one.final.ready_workers, one.final.existing_workers) == (1, 1, 1)
    kept = backend.store.load(ref).workers
    assert len(kept) == 1 and kept[0].proc == before[kept[0].name]
    for name, proc in before.items():
        assert procs.is_alive(proc) == (name == kept[0].name)
    assert list(scheduler_workers(backend.store.load(ref).address, backend.store.cluster_dir(ref))) == [kept[0].name]

    zero = backend.scale(ref, 0, timeout=60)
    assert (zero.final.ready_workers, zero.final.existing_workers, zero.final.status) == (0, 0, "Running")
    assert scheduler_workers(backend.store.load(ref).address, backend.store.cluster_dir(ref)) == {}
    assert backend.get_baseline(ref).replicas == 0


CLI_IN_A_CHILD = """
import json, sys
from flytekitplugins_ddlscale.cli import main
try:
    main(sys.argv[1:])
finally:
    print(json.dumps(sorted(m for m in sys.modules if m.partition(".")[0] in ("dask", "distributed"))))
"""
"""``ddlscale`` in a fresh interpreter; its last line of output lists the Dask modules it imported."""


def _up_in_a_child(state, name: str, replicas: int) -> list:
    """``ddlscale local up`` in a child process: the Dask modules it imported (it must succeed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDLSCALE_")}
    ran = subprocess.run(
        [sys.executable, "-c", CLI_IN_A_CHILD, "local", "up", "--name", name, "--replicas", str(replicas),
         "--timeout", "120", "--state-dir", str(state.parent)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return json.loads(ran.stdout.strip().splitlines()[-1])


def _listed(folder) -> list:
    """The worker names the scheduler's file lists (checked 0600, with no temporary file beside it)."""
    path = folder / WORKERS_FILE
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert [p.name for p in folder.iterdir() if p.name.startswith(f".{WORKERS_FILE}")] == []
    return json.loads(path.read_text())["workers"]


def test_up_counts_workers_from_the_schedulers_file_and_never_imports_distributed(local_state):
    backend = LocalBackend(state_dir=local_state, stop_grace=5.0)
    ref = ClusterRef("dask", "counted")
    folder = backend.store.cluster_dir(ref)
    for replicas in (2, 3):  # a new cluster, then one more worker
        assert _up_in_a_child(local_state, "counted", replicas) == []
        record = backend.store.load(ref)
        names = sorted(w.name for w in record.workers)
        assert len(names) == replicas and backend.get_state(ref).ready_workers == replicas
        assert _listed(folder) == names == sorted(scheduler_workers(record.address, folder))
        assert json.loads((folder / WORKERS_FILE).read_text())["scheduler"] == record.scheduler.to_json()

    down = backend.up(ref, 1, timeout=60)  # retiring asks the scheduler: this process imports distributed
    assert (down.final.ready_workers, down.final.existing_workers) == (1, 1)
    record = backend.store.load(ref)
    assert _listed(folder) == [record.workers[0].name] == list(scheduler_workers(record.address, folder))


def test_tiers_reach_the_scheduler_and_a_tier_change_replaces_workers(local_state, tiers_file):
    backend = LocalBackend(state_dir=local_state, tiers_file=tiers_file)
    ref = ClusterRef("dask", "tiers")
    result = backend.scale(ref, 2, timeout=60)
    assert result.final.worker_hw_tier == "Tiny"
    address = backend.store.load(ref).address
    seen = scheduler_workers(address, backend.store.cluster_dir(ref))
    assert {(w["nthreads"], w["memory_limit"]) for w in seen.values()} == {(1, 512 * 2**20)}
    old = {w.name: w.proc for w in backend.store.load(ref).workers}

    changed = backend.scale(ref, 2, "Duo", timeout=60)
    assert (changed.final.worker_hw_tier, changed.final.ready_workers, changed.final.existing_workers) == ("Duo", 2, 2)
    seen = scheduler_workers(address, backend.store.cluster_dir(ref))
    assert set(seen).isdisjoint(old)
    assert {(w["nthreads"], w["memory_limit"]) for w in seen.values()} == {(2, 768 * 2**20)}
    assert not any(procs.is_alive(p) for p in old.values())
    assert backend.get_baseline(ref).worker_hw_tier is None


def test_restart_head_keeps_the_port_and_workers_reconnect(backend):
    ref = ClusterRef("dask", "restart")
    backend.scale(ref, 2, timeout=60)
    before = backend.store.load(ref)
    result = backend.restart_head(ref, head_hw_tier="Medium", timeout=60)
    after = backend.store.load(ref)
    assert result.ready and result.pod == "restart-dask-scheduler-0"
    assert (result.final.ready_workers, result.final.head_hw_tier) == (2, "Medium")
    assert after.port == before.port and after.scheduler != before.scheduler
    assert not procs.is_alive(before.scheduler)
    assert sorted(w.name for w in after.workers) == sorted(w.name for w in before.workers)
    assert sorted(scheduler_workers(after.address, backend.store.cluster_dir(ref))) == sorted(w.name for w in before.workers)
    with backend.connected(ref), _client_from_env() as client:
        assert client.submit(sum, [1, 2, 3]).result() == 6
    assert backend.get_state(ref).head_hw_tier == "Medium"


def test_crashed_worker_and_scheduler_are_repaired(backend):
    ref = ClusterRef("dask", "repair")
    backend.scale(ref, 2, timeout=60)
    victim = backend.store.load(ref).workers[0]
    os.kill(victim.proc.pid, signal.SIGKILL)
    wait_dead(victim.proc)

    state = backend.get_state(ref)
    assert (state.status, state.existing_workers, state.desired_workers) == ("Starting", 1, 2)
    repaired = backend.repair(ref, timeout=60)
    assert (repaired.status, repaired.ready_workers) == ("Running", 2)
    assert victim.name not in {w.name for w in backend.store.load(ref).workers}

    record = backend.store.load(ref)
    os.kill(record.scheduler.pid, signal.SIGKILL)
    wait_dead(record.scheduler)
    failed = backend.get_state(ref)
    assert (failed.status, failed.head_ready) == ("Failed", False)
    again = backend.scale(ref, 2, timeout=60)
    assert (again.final.status, again.final.ready_workers) == ("Running", 2)
    assert backend.store.load(ref).port == record.port

    # After a reboot the recorded port may belong to someone else: the repaired scheduler moves.
    record = backend.store.load(ref)
    os.kill(record.scheduler.pid, signal.SIGKILL)
    wait_dead(record.scheduler)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        record.port = squatter.getsockname()[1]
        backend.store.save(record)
        repaired = backend.repair(ref, timeout=60)
    assert (repaired.status, repaired.ready_workers) == ("Running", 2)
    moved = backend.store.load(ref)
    assert moved.port != record.port
    assert backend.connection_env(ref)["DASK_SCHEDULER_SERVICE_PORT"] == str(moved.port)


def test_a_timed_out_scale_keeps_its_request_and_max_workers_caps(backend):
    ref = ClusterRef("dask", "timeout")
    backend.up(ref, 1, timeout=60)
    # Starting two worker processes takes longer than the timeout: the change alone spends it, and
    # the workers are not awaited past it (else the wait for them times out).
    spent_or_waited = r"before the wait for 3 workers|3 workers seen by the Dask scheduler"
    with pytest.raises(ScalingTimeoutError, match=spent_or_waited) as caught:
        backend.scale(ref, 3, timeout=0.05)
    assert caught.value.state is not None and caught.value.left_in_place == "desired_workers=3"
    # Nothing is rolled back: the two new workers keep starting and join.
    assert backend.get_state(ref).desired_workers == 3
    state = backend.wait_for_workers(ref, 3, timeout=60)
    assert (state.desired_workers, state.existing_workers, state.ready_workers) == (3, 3, 3)
    # A wait for fewer workers than the cluster runs (a floor) ends at once, with the real counts.
    assert backend.wait_for_workers(ref, 2, timeout=5).ready_workers == 3
    assert len(processes_mentioning(str(backend.store.cluster_dir(ref)))) == 4
    restored = backend.restore_baseline(ref, timeout=60)
    assert (restored.final.desired_workers, restored.final.ready_workers) == (1, 1)
    assert len(processes_mentioning(str(backend.store.cluster_dir(ref)))) == 2

    capped = LocalBackend(state_dir=backend.store.root, max_workers=1)
    result = capped.scale(ref, 2, timeout=60)
    assert (result.requested, result.effective, result.capped, result.final.ready_workers) == (2, 1, True, 1)
    assert len(processes_mentioning(str(backend.store.cluster_dir(ref)))) == 2


def test_a_worker_that_crashes_on_start_fails_fast_and_only_dead_processes_go(backend, monkeypatch):
    ref = ClusterRef("dask", "crashing")
    backend.up(ref, 1, timeout=60)
    healthy = backend.store.load(ref).workers[0]
    # A bad Dask setting in the environment makes every new worker process exit during start-up.
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL", "bogus")
    with pytest.raises(WorkerFailedError, match="exited before joining") as caught:
        backend.scale(ref, 2, timeout=60)
    assert caught.value.reason == "ProcessExited" and "Invalid time unit: bogus" in str(caught.value)
    assert "desired_workers=2 left in place: 1 of 2 workers ready" in str(caught.value)
    state = backend.get_state(ref)
    assert (state.desired_workers, state.existing_workers, state.ready_workers) == (2, 1, 1)
    assert [w.name for w in backend.store.load(ref).workers] == [healthy.name]
    assert procs.is_alive(healthy.proc)
    monkeypatch.delenv("DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL")
    restored = backend.restore_baseline(ref, timeout=60)
    assert (restored.final.desired_workers, restored.final.ready_workers, restored.final.status) == (1, 1, "Running")


def test_restore_baseline_removes_a_cluster_the_flow_created(backend):
    ref = ClusterRef("dask", "ephemeral")
    backend.scale(ref, 2, timeout=60)
    folder = str(backend.store.cluster_dir(ref))
    assert len(processes_mentioning(folder)) == 3

    assert backend.get_baseline(ref).replicas == 0
    # A restore ends every phase, as on the other backends: a claim left behind does not keep the cluster.
    backend.claim(ref, "left-behind", 1)
    result = backend.restore_baseline(ref)
    assert (result.previous.ready_workers, result.final.status) == (2, "Stopped")
    assert backend.list_clusters() == [] and backend.get_baseline(ref) is None
    assert backend.claims(ref) == {}
    assert processes_mentioning(folder) == []


def test_scaling_a_missing_cluster_to_zero_changes_nothing(backend, caplog):
    ref = ClusterRef("dask", "gone")
    with caplog.at_level(logging.INFO, logger="flytekitplugins_ddlscale.local"):
        result = backend.scale(ref, 0, timeout=60)
    assert (result.requested, result.effective, result.waited) == (0, 0, False)
    assert result.previous.status == result.final.status == "Stopped"
    assert "dask/gone does not exist; scaling it to 0 workers changes nothing" in caplog.text
    assert backend.list_clusters() == [] and backend.get_baseline(ref) is None
    assert processes_mentioning(str(backend.store.root)) == []


def test_restore_baseline_keeps_a_cluster_made_with_up(backend):
    ref = ClusterRef("dask", "kept")
    backend.up(ref, 1, timeout=60)
    assert backend.get_baseline(ref) is None
    backend.scale(ref, 1, "Medium", timeout=60)
    assert backend.get_baseline(ref).replicas == 1
    result = backend.restore_baseline(ref)
    assert (result.final.ready_workers, result.final.worker_hw_tier) == (1, "Small")
    assert backend.get_baseline(ref) is None
    explicit = backend.restore_baseline(ref, ReplicaSpec(0))
    assert explicit.final.desired_workers == 0 and backend.list_clusters() == [ref]
    assert backend.down(ref) is True
    assert processes_mentioning(str(backend.store.cluster_dir(ref))) == []


class _ReleaseOnRetry(logging.Handler):
    """Counts the supervisor's "starting it once more", and closes the sockets of ``to_close`` (on the head's
    port) then."""

    def __init__(self, holder: "socket.socket | None") -> None:
        super().__init__(logging.WARNING)
        self.to_close = [holder] if holder is not None else []
        self.retries = []

    def emit(self, record: logging.LogRecord) -> None:
        if "starting it once more" in record.getMessage():
            self.retries.append(record.getMessage())
            for holder in self.to_close:
                holder.close()


def _hold_port(port: int) -> socket.socket:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the killed scheduler's connections linger
    holder.bind(("127.0.0.1", port))
    holder.listen(1)
    return holder


@pytest.mark.parametrize("taken", ["before the restart", "at its start, freed on the retry", "at its start, for good"])
def test_a_restarted_head_whose_port_is_taken_moves_or_is_started_once_more(backend, taken):
    """A head restart on a port something else holds (after a crash: another user's listener; issue 44) moves
    the head to new ports, as a repair does. One taken between that check and the head's bind makes the head
    exit while starting: it is started once more, on the same port when it is free again, else on new ones."""
    from flytekitplugins_ddlscale._core.lifetime import add_pause_hook

    ref = ClusterRef("dask", f"retry-{taken.split()[-1]}")
    backend.scale(ref, 1, timeout=60)
    before = backend.store.load(ref)
    os.kill(before.scheduler.pid, signal.SIGKILL)
    wait_dead(before.scheduler)
    holders = [_hold_port(before.port)] if taken == "before the restart" else []

    def take_the_port(point: str) -> None:
        # The head has started and not bound its port yet (it binds once the command asked for its workers).
        if point == "head-started" and not holders:
            holders.append(_hold_port(before.port))

    watcher = _ReleaseOnRetry(None)
    if taken == "at its start, freed on the retry":
        watcher.to_close = holders  # filled by the hook before the retry
    logging.getLogger("flytekitplugins_ddlscale.local").addHandler(watcher)
    remove = add_pause_hook(take_the_port) if not holders else (lambda: None)
    try:
        result = backend.restart_head(ref, timeout=60)
    finally:
        remove()
        logging.getLogger("flytekitplugins_ddlscale.local").removeHandler(watcher)
        for holder in holders:
            holder.close()
    assert result.ready and result.final.ready_workers == 1
    after = backend.store.load(ref)
    assert (after.port == before.port) is (taken == "at its start, freed on the retry")
    assert backend.connection_env(ref)["DASK_SCHEDULER_SERVICE_PORT"] == str(after.port)
    assert len(watcher.retries) == (0 if taken == "before the restart" else 1)
    assert all(f"dask/{ref.name}" in retry for retry in watcher.retries)


def _descriptors(pid: int) -> set:
    """What process ``pid``'s descriptors 3 and up point at (files, sockets, pipes; not the anonymous
    inode every epoll instance shares)."""
    return {target for fd, target in descriptor_targets(pid).items() if fd > 2 and not target.startswith("anon_inode:")}


def test_each_worker_of_a_new_cluster_is_a_program_of_its_own_and_stands_alone(local_state):
    """``up`` of a new cluster, then one more worker: every worker runs ``dask worker`` as a program of its
    own, is no child of the scheduler, runs in a session of its own, carries the cluster's mark, has
    /dev/null as stdin and its own log as stdout and stderr, and shares no other descriptor with any
    process of the cluster (not another's log)."""
    import psutil

    backend = LocalBackend(state_dir=local_state, stop_grace=5.0)
    ref = ClusterRef("dask", "alone")
    assert backend.up(ref, 2, timeout=120).final.ready_workers == 2
    assert backend.up(ref, 3, timeout=120).final.ready_workers == 3
    record = backend.store.load(ref)
    head = psutil.Process(record.scheduler.pid)
    assert "distributed.cli.dask_scheduler" in head.cmdline()
    mark = backend.supervisor.mark(ref)
    shared_with = {}
    for proc in [record.scheduler, *(w.proc for w in record.workers)]:
        for target in _descriptors(proc.pid):
            shared_with.setdefault(target, []).append(proc.pid)
    assert {target: pids for target, pids in shared_with.items() if len(pids) > 1} == {}
    sessions = {os.getsid(proc.pid) for proc in [record.scheduler, *(w.proc for w in record.workers)]}
    assert len(sessions) == 1 + len(record.workers)
    for worker in record.workers:
        process = psutil.Process(worker.proc.pid)
        assert "distributed.cli.dask_worker" in process.cmdline()
        assert process.ppid() != head.pid
        assert mark.verdict(process.pid) is True
        log = str(backend.store.log_path(ref, worker.name))
        assert [os.readlink(f"/proc/{process.pid}/fd/{fd}") for fd in (0, 1, 2)] == [os.devnull, log, log]
    assert sorted(scheduler_workers(record.address, backend.store.cluster_dir(ref))) == sorted(
        w.name for w in record.workers)
    backend.down(ref)
    assert processes_mentioning(str(local_state), environment=True) == []


def test_no_process_of_a_dask_cluster_keeps_scratch_space_in_a_folder_other_users_share(local_state):
    """Dask's default scratch space is ``dask-scratch-space`` under the system's temporary folder, one folder
    for every user (who could make it first, or fill it): the scheduler keeps its lock file in the cluster's
    private folder instead, as the workers do."""
    import tempfile

    backend = LocalBackend(state_dir=local_state, stop_grace=5.0)
    ref = ClusterRef("dask", "scratch")
    backend.up(ref, 1, timeout=120)
    record = backend.store.load(ref)
    shared = os.path.join(tempfile.gettempdir(), "dask-scratch-space")
    private = os.path.realpath(backend.store.cluster_dir(ref) / "work")
    opened = {pid: _descriptors(pid) for pid in (record.scheduler.pid, record.workers[0].proc.pid)}
    assert {pid: [t for t in targets if t.startswith(shared)] for pid, targets in opened.items()} == {
        pid: [] for pid in opened}
    for targets in opened.values():
        assert any(target.startswith(private + os.sep) and target.endswith(".dirlock") for target in targets), targets
    backend.down(ref)


def test_a_new_clusters_head_whose_port_is_taken_before_it_binds_it_starts_on_new_ports(local_state):
    """A port found free is free only until something takes it: here a listener takes the new scheduler's
    port right after the head started (it cannot have bound it yet: it binds once the command has asked
    for its workers). The scheduler exits, and its second start, for a cluster nobody reached yet, is on
    a port chosen anew: ``up`` succeeds there, and the taken port is left to its holder."""
    import psutil

    from flytekitplugins_ddlscale._core.lifetime import add_pause_hook

    backend = LocalBackend(state_dir=local_state, stop_grace=5.0)
    ref = ClusterRef("dask", "taken")
    holders = []

    def take_the_port(point: str) -> None:
        if point == "head-started" and not holders:
            [command] = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                         if str(local_state) in " ".join(p.info["cmdline"] or []) and "--port" in (p.info["cmdline"] or [])]
            port = int(command[command.index("--port") + 1])
            holders.append((port, _hold_port(port)))

    remove = add_pause_hook(take_the_port)
    try:
        result = backend.up(ref, 1, timeout=120)
    finally:
        remove()
        for _, holder in holders:
            holder.close()
    assert holders, "the head was never started"
    [(taken, _)] = holders
    record = backend.store.load(ref)
    assert result.final.ready_workers == 1 and record.port != taken
    assert f"tls://127.0.0.1:{record.port}" == record.address
    backend.down(ref)
