"""A local cluster is safe from where its user stands and from what its records say.

- Nothing is imported from the caller's working directory: a poisoned ``inspect.py`` (and modules
  named after what a Dask process imports) left there is never run by the cluster's processes.
- A tampered or broken ``cluster.json`` (nested 1,000 deep, a directory, a FIFO or a link in its place, a
  host off loopback or one that needs DNS, a pid of an unrelated process) is refused with one line;
  ``list`` and ``down --all`` still see and stop every other cluster; no process is signalled unless
  its environment carries the cluster's mark (the folder's real path).
- What the caller's environment passes on is checked too: a value of an allowed variable that carries a
  credential is dropped, and a bad ``$DDLSCALE_WATCH_GRACE`` is refused before anything starts.
- The file in which a Dask scheduler lists its registered workers (``dask-workers.json``) is read as a record:
  garbage, an oversized file, a link, a FIFO, another user's file, names that are not strings or too many
  are refused in one line naming the file; a file an earlier scheduler of the folder left counts nothing.
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.local import LocalBackend
from flytekitplugins_ddlscale.backends.local._dask_watch import WORKERS_FILE
from tests.test_local_support import local_state  # noqa: F401  (fixture)

DDLSCALE = str(Path(sys.executable).parent / "ddlscale")
POISON = 'open({sentinel!r}, "a").write(__name__ + "\\n")\nraise SystemExit("poisoned module imported")\n'


def _cli(state: Path, *args: str):
    """``ddlscale local *args`` in this process (a command that hung would fail the test on pytest's timeout)."""
    from click.testing import CliRunner

    from flytekitplugins_ddlscale.cli.local_commands import local

    return CliRunner().invoke(local, [*args, "--state-dir", str(state.parent)])


def _ddlscale(state: Path, *args: str, cwd: Path = None, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDLSCALE_")}
    return subprocess.run([DDLSCALE, "local", *args, "--state-dir", str(state.parent)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_poisoned_module_in_the_callers_folder_is_not_imported_by_the_cluster(local_state, tmp_path):
    shared = tmp_path / "shared-folder"
    shared.mkdir()
    sentinel = tmp_path / "poison-ran"
    # inspect: imported by nearly everything; distributed and dask: what the cluster's `python -m` imports first.
    for name in ("inspect", "distributed", "dask", "msgpack"):
        (shared / f"{name}.py").write_text(POISON.format(sentinel=str(sentinel)))
    up = _ddlscale(local_state, "up", "--name", "poisoned", "--replicas", "1", "--timeout", "120", cwd=shared)
    assert up.returncode == 0, up.stdout + up.stderr
    status = _ddlscale(local_state, "status", "--name", "poisoned", "--json", cwd=shared)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["status"] == "Running"
    assert not sentinel.exists(), sentinel.read_text()
    down = _ddlscale(local_state, "down", "--name", "poisoned", cwd=shared)
    assert down.returncode == 0, down.stderr
    assert not sentinel.exists(), sentinel.read_text()


# ------------------------------------------------------------------ tampered and broken records

def _damage_nested(path: Path) -> None:
    path.write_text("[" * 1000 + "]" * 1000)


def _damage_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _damage_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


def _damage_link(path: Path) -> None:
    # The record itself, moved beside its place and linked from there: only the link is wrong.
    target = path.with_name("elsewhere.json")
    path.rename(target)
    path.symlink_to(target)


def _damage_encoding(path: Path) -> None:
    path.write_bytes(b'{"kind": "dask", "name": "\xff\xfe"}')


def _damage_huge_number(path: Path) -> None:
    path.write_text(path.read_text().replace('"port": ', '"port": 1' + "0" * 5000 + " + ", 1).replace(" + ", "", 1))


def _set_host(host: str):
    def damage(path: Path) -> None:
        data = json.loads(path.read_text())
        data["host"] = host
        path.write_text(json.dumps(data))
    return damage


DAMAGES = {
    "nested": (_damage_nested, "cluster.json="),
    "folder": (_damage_folder, "cluster.json='a folder'"),
    "fifo": (_damage_fifo, "cluster.json='not a regular file'"),
    "link": (_damage_link, "cluster.json='it is a symbolic link'; allowed: a regular file, not a link"),
    "encoding": (_damage_encoding, "not UTF-8"),
    "huge-number": (_damage_huge_number, "allowed: a JSON object as ddlscale writes it"),
    "all-interfaces": (_set_host("0.0.0.0"), "host='0.0.0.0'; allowed: a loopback address"),
    "needs-dns": (_set_host("no-such-host.invalid"), "host='no-such-host.invalid'"),
}


@pytest.mark.parametrize("failure", [
    lambda: int(float("inf")),  # OverflowError
    lambda: json.loads("[" * 100_000 + "]" * 100_000),  # RecursionError
    lambda: b"\xff".decode("utf-8"),  # UnicodeDecodeError
    lambda: {"pid": 1}["start"],  # KeyError
    lambda: int(None),  # TypeError
])
def test_any_failure_to_read_a_record_is_a_corrupt_record_in_one_line(failure):
    from flytekitplugins_ddlscale import CorruptRecordError
    from flytekitplugins_ddlscale._core.records import reading

    with pytest.raises(CorruptRecordError) as caught:
        with reading("/state/cluster.json", "run `ddlscale local down`"):
            failure()
    text = str(caught.value)
    assert "\n" not in text and text.startswith("[corrupt_record] corrupt record /state/cluster.json: record=")
    assert text.endswith("run `ddlscale local down`")


def _running(state: Path) -> list:
    from tests.test_local_support import processes_mentioning

    return processes_mentioning(str(state), environment=True)


@pytest.mark.slow
def test_each_broken_record_is_one_line_and_down_all_still_stops_every_cluster(local_state):
    """Eight clusters whose ``cluster.json`` is damaged in eight ways (two of them running), and one healthy
    running: ``status --repair``
    refuses each in one line (nothing restarted, no DNS wait, no hang on the FIFO), ``list`` shows all eight,
    ``down --all`` stops every process of every one of them."""
    backend = LocalBackend(state_dir=local_state)
    refs = {name: ClusterRef("dask", name) for name in [*DAMAGES, "healthy"]}
    running = ("nested", "fifo", "healthy")  # the others hold a record and no process (each start costs seconds)
    for name in running:
        backend.up(refs[name], 0, timeout=120)
    schedulers = {name: backend.store.load(refs[name]).scheduler.pid for name in running}
    for name, ref in refs.items():
        if name not in running:
            data = {**json.loads(backend.store.record_path(refs["healthy"]).read_text()), "name": name,
                    "scheduler": None}
            backend.store.private_cluster_dir(ref)
            backend.store.record_path(ref).write_text(json.dumps(data))
    for name, (damage, _) in DAMAGES.items():
        damage(backend.store.record_path(refs[name]))
    for name, (_, says) in DAMAGES.items():
        status = _cli(local_state, "status", "--name", name, "--repair", "--timeout", "30")
        assert status.exit_code == 2, status.output
        lines = status.stderr.strip().splitlines()
        assert len(lines) == 1 and "corrupt record" in lines[0] and says in lines[0], status.stderr
    assert sorted(_running(local_state)) == sorted(schedulers.values())  # nothing restarted or stopped
    listed = _cli(local_state, "list", "--json")
    assert listed.exit_code == 0, listed.output
    statuses = {info["name"]: info["status"] for info in json.loads(listed.stdout)}
    assert statuses == {**{name: "Corrupt" for name in DAMAGES}, "healthy": "Running"}
    down = _cli(local_state, "down", "--all")
    assert down.exit_code == 0, down.output
    assert down.stdout.startswith(f"stopped {len(refs)} clusters"), down.stdout
    assert _running(local_state) == []
    assert backend.store.folders() == []


def _listing(scheduler, workers, http_port=8787) -> str:
    return json.dumps({"scheduler": scheduler, "http_port": http_port, "workers": workers})


WORKERS_FILE_DAMAGES = {
    "garbage": (lambda path, file: path.write_text("4 workers, trust me"),
                "dask-workers.json='4 workers, trust me'; allowed: a JSON object as ddlscale writes it"),
    "oversize": (lambda path, file: path.write_bytes(b" " * ((1 << 20) + 1)),
                 "dask-workers.json='over 1048576 bytes'; allowed: a regular file of at most 1048576 bytes"),
    "fifo": (lambda path, file: os.mkfifo(path, 0o600), "dask-workers.json='not a regular file'"),
    "names-not-strings": (lambda path, file: path.write_text(_listing(file["scheduler"], ["w-0", 3])),
                          "workers=['w-0', 3]; allowed: a list of at most 1000 worker names"),
    "too-many-names": (lambda path, file: path.write_text(_listing(file["scheduler"], [f"w-{i}" for i in range(1001)])),
                       "allowed: a list of at most 1000 worker names"),
    "scheduler-not-a-process": (lambda path, file: path.write_text(_listing("the current one", file["workers"])),
                                "scheduler='the current one'; allowed: a JSON object"),
    "port-out-of-range": (lambda path, file: path.write_text(_listing(file["scheduler"], file["workers"], 70000)),
                          "http_port=70000; allowed: an integer from 1 to 65535"),
    "port-missing": (lambda path, file: path.write_text(json.dumps({"scheduler": file["scheduler"],
                                                                     "workers": file["workers"]})),
                     "http_port=None; allowed: present"),
}
"""How the workers file is damaged (given its path and what the scheduler wrote), and what the one-line error says."""


@pytest.mark.slow
def test_a_damaged_workers_file_is_one_line_naming_it_and_never_a_count(local_state, tmp_path):
    """A running cluster whose scheduler's ``dask-workers.json`` is replaced: ``status`` refuses each damage in one
    line naming the file and what it must be (never a traceback, never a count), ``list`` shows it Corrupt; the
    file the scheduler wrote, put back, counts again. A link to a copy of that file counts nothing either."""
    backend = LocalBackend(state_dir=local_state)
    ref = ClusterRef("dask", "listed")
    backend.up(ref, 1, timeout=120)
    path = backend.store.cluster_dir(ref) / WORKERS_FILE
    written = path.read_text()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(written)
    damages = {
        **WORKERS_FILE_DAMAGES,
        "link": (lambda path, file: path.symlink_to(elsewhere),
                 "dask-workers.json='it is a symbolic link'; allowed: a regular file, not a link"),
    }
    if os.geteuid() == 0:  # only root can give a file of this user's folder to another user
        damages["other-owner"] = (lambda path, file: (path.write_text(written), os.chown(path, 65534, 65534)),
                                  "dask-workers.json='owned by uid 65534'")
    for name, (damage, says) in damages.items():
        path.unlink()
        damage(path, json.loads(written))
        status = _cli(local_state, "status", "--name", "listed")
        assert status.exit_code == 2, (name, status.output)
        lines = status.stderr.strip().splitlines()
        assert len(lines) == 1 and f"corrupt record {path}: " in lines[0] and says in lines[0], (name, status.stderr)
    listed = _cli(local_state, "list", "--json")
    assert [info["status"] for info in json.loads(listed.stdout)] == ["Corrupt"], listed.output
    path.unlink()
    path.write_text(written)
    state = backend.get_state(ref)
    assert (state.status, state.ready_workers) == ("Running", 1)


@pytest.mark.slow
def test_a_workers_file_an_earlier_scheduler_left_counts_nothing(local_state):
    """The scheduler writes its file anew when it starts (a head restart), with its pid and start time on it;
    the earlier scheduler's file put back in its place, listing the same worker, is not trusted (the head reads
    as not answering, no worker counts) until the scheduler rewrites it at the next worker change."""
    backend = LocalBackend(state_dir=local_state)
    ref = ClusterRef("dask", "stale")
    backend.up(ref, 1, timeout=120)
    path = backend.store.cluster_dir(ref) / WORKERS_FILE
    earlier, before = path.read_text(), backend.store.load(ref)
    restarted = backend.restart_head(ref, timeout=120)
    after = backend.store.load(ref)
    assert restarted.final.ready_workers == 1 and after.scheduler != before.scheduler
    rewritten = json.loads(path.read_text())
    assert (rewritten["scheduler"], rewritten["workers"]) == (after.scheduler.to_json(), [after.workers[0].name])
    assert json.loads(earlier)["workers"] == [after.workers[0].name]

    path.write_text(earlier)
    state = backend.get_state(ref)
    assert (state.head_ready, state.ready_workers, state.status) == (False, 0, "Failed")
    grown = backend.up(ref, 2, timeout=120)
    assert (grown.final.head_ready, grown.final.ready_workers) == (True, 2)
    assert json.loads(path.read_text())["scheduler"] == after.scheduler.to_json()


@pytest.mark.slow
def test_a_record_naming_an_unrelated_process_gets_it_nothing(local_state):
    """A live ``sleep`` of the same user, its pid and start time written into ``cluster.json`` as the
    scheduler: ``up`` and ``run`` refuse the record (the real scheduler is not stopped as unrecorded), ``down`` stops
    the real scheduler by its mark and never signals the ``sleep``."""
    from flytekitplugins_ddlscale.backends.local import _procs as procs

    backend = LocalBackend(state_dir=local_state)
    ref = ClusterRef("dask", "planted")
    backend.up(ref, 0, timeout=120)
    real = backend.store.load(ref).scheduler
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        path = backend.store.record_path(ref)
        data = json.loads(path.read_text())
        data["scheduler"] = {"pid": bystander.pid, "start": procs.start_time(bystander.pid)}
        path.write_text(json.dumps(data))
        up = _ddlscale(local_state, "up", "--name", "planted", "--replicas", "0", "--timeout", "60")
        assert up.returncode == 2, up.stdout + up.stderr
        assert f"scheduler.pid={bystander.pid}" in up.stderr and len(up.stderr.strip().splitlines()) == 1
        assert procs.is_alive(real), "the real scheduler was stopped on the word of a tampered record"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDLSCALE_")}
        run = subprocess.run([DDLSCALE, "run", "--backend", "local", "--kind", "dask", "--name", "planted",
                              "--replicas", "0", "--timeout", "60", "--", "true"],
                             env={**env, "DDLSCALE_STATE_DIR": str(local_state.parent)}, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 2 and f"scheduler.pid={bystander.pid}" in run.stderr, run.stdout + run.stderr
        assert procs.is_alive(real), "`run` stopped the real scheduler on the word of a tampered record"
        down = _ddlscale(local_state, "down", "--name", "planted")
        assert down.returncode == 0, down.stderr
        assert f"pids {real.pid}" in down.stdout, down.stdout
        assert not procs.is_alive(real) and bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


EXEC_CHAIN = 'if [ "$1" -gt 0 ]; then exec sh -c "$0" "$0" "$(($1 - 1))"; fi; exec sleep 300'
"""``sh -c EXEC_CHAIN EXEC_CHAIN n``: one pid execs ``sh`` n times, then ``sleep``."""


def test_a_cluster_process_execing_the_next_program_of_its_chain_is_never_taken_for_a_stranger(local_state):
    """A cluster process runs a chain of programs under one pid (Spark's: ``env``, ``bash``, ``java``); at
    each exec its environment reads empty for an instant and the next read sees the next program. A record
    naming such a process, read again and again while it execs 2,000 times, is never refused as naming a
    process that is not the cluster's (CI once read the empty instant as "no mark" and the next read as
    "not exiting", and refused the record of a Spark worker starting), and ``stop_processes`` stops it."""
    from flytekitplugins_ddlscale.backends.local import _procs as procs
    from flytekitplugins_ddlscale.backends.local._state import ClusterRecord

    backend = LocalBackend(state_dir=local_state)
    ref = ClusterRef("dask", "chain")
    with backend.supervisor.lock(ref, 5):
        backend.store.save(ClusterRecord(ref=ref, host="127.0.0.1", worker_hw_tier="Small", desired=0))
    folder = backend.store.cluster_dir(ref)
    mark = procs.Mark.of(folder)
    chain = procs.spawn_detached(["sh", "-c", EXEC_CHAIN, EXEC_CHAIN, "2000"], folder / "logs" / "chain.log",
                                 mark, folder)
    try:
        path = backend.store.record_path(ref)
        path.write_text(json.dumps({**json.loads(path.read_text()), "scheduler": chain.to_json()}))
        reads = 0
        while psutil.Process(chain.pid).name() != "sleep":
            assert backend.store.load(ref).scheduler == chain
            reads += 1
        assert reads > 0 and mark.verdict(chain.pid) is True
        procs.stop_processes([chain], mark, grace=5)
        assert not procs.is_alive(chain)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(chain.pid, signal.SIGKILL)


def _proc_ticks(pid: int) -> int:
    """The start time of ``pid`` as records written before psutil hold it: field 22 of ``/proc/<pid>/stat``."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def test_a_process_identity_in_the_form_records_hold_names_its_process_and_no_reused_pid(tmp_path):
    """A pid with its start in ``/proc`` clock ticks (what every version has recorded) is the running
    process: it is stopped. The same pid with another start (a reused pid) gets nothing signalled."""
    from flytekitplugins_ddlscale.backends.local import _procs as procs

    folder = tmp_path / "cluster"
    mark = procs.Mark.of(folder)
    proc = procs.spawn_detached(["sleep", "300"], folder / "logs" / "sleep.log", mark, tmp_path)
    recorded = procs.ProcessId(proc.pid, _proc_ticks(proc.pid))
    reused = procs.ProcessId(proc.pid, recorded.start - 1)
    try:
        assert proc == recorded and procs.is_alive(recorded) and not procs.is_alive(reused)
        procs.stop_processes([reused], mark, grace=1)
        assert procs.is_alive(recorded), "a process was signalled on the word of a reused pid's record"
        procs.stop_processes([recorded], mark, grace=5)
        assert not procs.is_alive(recorded)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_record_written_before_psutil_still_finds_and_stops_its_scheduler(local_state):
    """``cluster.json`` with the scheduler's start read from ``/proc`` by hand, as earlier versions
    wrote it: ``list`` counts the scheduler as recorded and ``down`` stops it as recorded; the same pid
    with another start (a reused pid) does not vouch for the process: ``list`` shows it unrecorded."""
    backend = LocalBackend(state_dir=local_state)
    ref = ClusterRef("dask", "earlier")
    backend.up(ref, 0, timeout=120)
    path = backend.store.record_path(ref)
    data = json.loads(path.read_text())
    pid = data["scheduler"]["pid"]

    def listed_unrecorded(start: int) -> list:
        path.write_text(json.dumps({**data, "scheduler": {"pid": pid, "start": start}}))
        listed = _cli(local_state, "list", "--json")
        assert listed.exit_code == 0, listed.output
        [info] = json.loads(listed.stdout)
        return info["unrecorded_pids"]

    assert listed_unrecorded(_proc_ticks(pid) - 1) == [pid]
    assert listed_unrecorded(_proc_ticks(pid)) == []
    down = _cli(local_state, "down", "--name", "earlier")
    assert down.exit_code == 0, down.output
    assert "found 1 recorded process running" in down.stdout and "did not hold" not in down.stdout, down.stdout
    assert _running(local_state) == []


@pytest.mark.slow
def test_the_same_state_directory_through_a_linked_path_finds_every_process(tmp_path):
    """A process of the cluster whose mark spells the folder through a link (started through a linked
    path) is the cluster's: ``list`` through the real path sees it, ``down`` stops it."""
    real = tmp_path / "real"
    (real / "state").mkdir(parents=True)
    linked = tmp_path / "linked"
    linked.symlink_to(real)
    state = linked / "state" / "local"
    try:
        backend = LocalBackend(state_dir=state)
        ref = ClusterRef("dask", "linked")
        backend.up(ref, 0, timeout=120)
        spelled = str(backend.store.cluster_dir(ref))
        assert spelled.startswith(str(linked))
        stray = subprocess.Popen(["sleep", "300"], env={**os.environ, "DDLSCALE_LOCAL_CLUSTER": spelled})
        through_real = real / "state" / "local"
        listed = _ddlscale(through_real, "list", "--json", timeout=60)
        assert listed.returncode == 0, listed.stderr
        [info] = json.loads(listed.stdout)
        assert info["unrecorded_pids"] == [stray.pid], info
        down = _ddlscale(through_real, "down", "--name", "linked")
        assert down.returncode == 0, down.stderr
        assert stray.wait(timeout=30) is not None
        assert _running(real) == []
    finally:
        LocalBackend(state_dir=real / "state" / "local").shutdown_all()


NOBODY = 65534


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the other user's process is started as uid 65534")
def test_roots_down_leaves_another_users_process_that_names_roots_folder(local_state):
    backend = LocalBackend(state_dir=local_state)
    ref = ClusterRef("dask", "rooted")
    backend.up(ref, 0, timeout=120)
    folder = str(backend.store.cluster_dir(ref))
    other = subprocess.Popen(["sleep", "300"], user=NOBODY, env={"DDLSCALE_LOCAL_CLUSTER": folder, "PATH": "/usr/bin:/bin"})
    try:
        listed = _ddlscale(local_state, "list", "--json", timeout=60)
        assert [info["unrecorded_pids"] for info in json.loads(listed.stdout)] == [[]], listed.stdout
        down = _ddlscale(local_state, "down", "--name", "rooted")
        assert down.returncode == 0, down.stderr
        assert "did not hold" not in down.stdout, down.stdout
        assert other.poll() is None, "root's down signalled another user's process"
    finally:
        other.kill()
        other.wait()


# ------------------------------------------------------------------ the environment passed on

def test_allowed_variables_whose_values_carry_a_credential_are_not_passed_on():
    from flytekitplugins_ddlscale._core.redaction import register_secret
    from flytekitplugins_ddlscale.backends.local._process_env import cluster_environment

    register_secret("registered-s3cr3t-value")
    starter = {
        "PATH": "/opt/apikey:/usr/bin", "SPARK_HOME": "/opt/spark", "DASK_SCHEDULER_ADDRESS": "tcp://127.0.0.1:1",
        "SPARK_DAEMON_JAVA_OPTS": "-Xmx1g -Dspark.authenticate.secret=hunter2hunter2",
        "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=true",
        "SPARK_MASTER_OPTS": "-Djavax.net.ssl.keyStorePassword=changeit",
        "RAY_DASHBOARD_URL": "http://admin:pw@127.0.0.1:8265", "DASK_CUSTOM": "--token=abc123",
        "PYSPARK_SUBMIT_ARGS": "--conf spark.hadoop.fs.s3a.access.key=AKIA0000 pyspark-shell",
        "LC_CUSTOM": "registered-s3cr3t-value", "DDLSCALE_WATCH_GRACE": "5",
    }
    assert cluster_environment(starter) == {
        "PATH": "/opt/apikey:/usr/bin", "SPARK_HOME": "/opt/spark", "DASK_SCHEDULER_ADDRESS": "tcp://127.0.0.1:1",
        "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=true", "DDLSCALE_WATCH_GRACE": "5",
    }


def _wait_for_line(path: Path, line: str, timeout: float) -> str:
    """The text of ``path`` once it holds ``line`` (what the process writes last), at most ``timeout`` s later."""
    import time

    ends = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if f"\n{line}\n" in f"\n{text}":
            return text
        assert time.monotonic() < ends, f"{path} did not get {line!r} within {timeout:.0f}s: {text[-500:]}"
        time.sleep(0.05)


def test_a_spawned_cluster_process_gets_no_credential_in_an_allowed_variable(tmp_path, monkeypatch):
    from flytekitplugins_ddlscale.backends.local import _procs as procs

    monkeypatch.setenv("SPARK_DAEMON_JAVA_OPTS", "-Dspark.authenticate.secret=hunter2hunter2")
    monkeypatch.setenv("SPARK_WORKER_OPTS", "-Dspark.worker.cleanup.enabled=true")
    folder = tmp_path / "cluster"
    mark = procs.Mark.of(folder)
    log = folder / "logs" / "env.log"
    proc = procs.spawn_detached(["sh", "-c", "env; echo END; exec sleep 60"], log, mark, tmp_path)
    try:
        text = _wait_for_line(log, "END", timeout=60)
    finally:
        procs.stop_processes([proc], mark, grace=5)
    assert "SPARK_WORKER_OPTS=-Dspark.worker.cleanup.enabled=true" in text
    assert "hunter2" not in text and "SPARK_DAEMON_JAVA_OPTS" not in text


@pytest.mark.parametrize("grace", ["abc", "-5"])
def test_a_bad_watch_grace_is_refused_before_anything_starts(local_state, grace):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDLSCALE_")}
    ran = subprocess.run([DDLSCALE, "local", "up", "--name", "graced", "--replicas", "1", "--state-dir",
                          str(local_state.parent)], env={**env, "DDLSCALE_WATCH_GRACE": grace}, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert ran.stderr.strip().splitlines() == [
        f"Error: [invalid_input] invalid DDLSCALE_WATCH_GRACE={grace!r}; allowed: a number of seconds > 0"
    ], ran.stderr
    assert not local_state.exists() or LocalBackend(state_dir=local_state).store.folders() == []
