"""The state directory cannot be steered by another user, and records are checked before use.

The tests run as root, so "another user" is ``nobody``: folders are handed to it with ``chown``.
"""
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from flytekitplugins_ddlscale import ClusterRef, CorruptRecordError, UnsafePathError
from flytekitplugins_ddlscale.backends.local import LocalBackend, _procs as procs, _ray_ops as ray_ops
from flytekitplugins_ddlscale.backends.local._state import ClusterRecord
from flytekitplugins_ddlscale.cli.local_commands import local
from flytekitplugins_ddlscale.backends._support.filestore import FileRecordStore
from tests.test_local_support import local_state, processes_mentioning  # noqa: F401

REF = ClusterRef("dask", "steered")
NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _victim(tmp_path: Path) -> Path:
    """A folder of someone else's files, with a cluster record a folder link would expose."""
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "precious.txt").write_text("keep me")
    (victim / "sub" / "deep.txt").write_text("keep me too")
    (victim / "cluster.json").write_text(json.dumps({"kind": "dask", "name": REF.name, "host": "127.0.0.1", "port": 0}))
    return victim


def _files(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_new_state_folders_are_private(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "state"))
    backend = LocalBackend()
    folders = [tmp_path / "state", backend.store.root, backend.store.clusters_dir, backend.store.records_dir]
    assert [_mode(f) for f in folders] == [0o700] * 4
    with backend.supervisor.lock(REF, 5):
        assert _mode(backend.store.cluster_dir(REF)) == 0o700
    assert _mode(FileRecordStore(tmp_path / "a" / "b").directory) == 0o700 and _mode(tmp_path / "a") == 0o700


def test_spawned_logs_are_private_and_never_written_through_a_link(tmp_path):
    logs = tmp_path / "cluster" / "logs"
    proc = procs.spawn_detached(["sh", "-c", "echo hello; sleep 30"], logs / "first.log", procs.Mark.of(tmp_path / "cluster"),
                                tmp_path / "cluster")
    procs.stop_processes([proc], procs.Mark.of(tmp_path / "cluster"), grace=5)
    assert _mode(logs) == 0o700 and _mode(logs / "first.log") == 0o600
    target = tmp_path / "other-file"
    target.write_text("someone else's\n")
    (logs / "linked.log").symlink_to(target)
    with pytest.raises(UnsafePathError, match="linked.log.*symbolic link"):
        procs.spawn_detached(["sh", "-c", "echo hello; sleep 30"], logs / "linked.log", procs.Mark.of(tmp_path / "cluster"),
                            tmp_path / "cluster")
    assert target.read_text() == "someone else's\n"
    # Quoting a log in an error does not read through a link either.
    assert "someone else" not in procs.log_tail(logs / "linked.log")


@pytest.mark.parametrize("how", ["owned by nobody", "group-writable", "a link"])
def test_a_state_dir_others_can_steer_is_refused_with_the_remedy(tmp_path, how):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    remedy = {"owned by nobody": "choose a state directory of your own", "group-writable": "chmod go-w",
              "a link": "remove the link"}[how]
    if how == "owned by nobody":
        os.chown(state, NOBODY, NOBODY)
    elif how == "group-writable":
        os.chmod(state, 0o770)
    else:
        state.rename(tmp_path / "real")
        state.symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePathError, match=remedy) as caught:
        LocalBackend(state_dir=state)
    assert caught.value.path == str(state) and caught.value.code == "unsafe_state_dir"
    with pytest.raises(UnsafePathError):
        FileRecordStore(state)
    result = CliRunner().invoke(local, ["--state-dir", str(state), "list"])
    assert result.exit_code == 2 and str(state) in result.output and remedy in result.output
    assert not (tmp_path / "real" / "clusters").exists() and not (state / "clusters").exists()


def test_a_folder_made_by_another_uid_is_refused():
    # A real second user: nobody creates the cluster's folder in a clusters folder opened to it.
    base = Path(tempfile.mkdtemp())
    try:
        state = base / "state"
        LocalBackend(state_dir=state)
        for folder in (base, state):
            os.chmod(folder, 0o711)
        os.chmod(state / "clusters", 0o777)
        folder = state / "clusters" / "_.dask.steered"
        subprocess.run(["mkdir", "-m", "700", str(folder)], user=NOBODY, check=True, timeout=30)
        os.chmod(state / "clusters", 0o700)
        assert os.lstat(folder).st_uid == NOBODY
        with pytest.raises(UnsafePathError, match="owned by uid 65534, not by you"):
            LocalBackend(state_dir=state).up(REF, 1, timeout=5)
        assert processes_mentioning(str(state)) == []
    finally:
        for pid in processes_mentioning(str(base)):  # none is expected: nothing of the cluster may start
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base)


def test_down_through_a_linked_cluster_folder_removes_nothing_outside(tmp_path):
    state = tmp_path / "state"
    backend = LocalBackend(state_dir=state / "local")
    victim = _victim(tmp_path)
    before = _files(victim)
    backend.store.cluster_dir(REF).symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        backend.down(REF)
    result = CliRunner().invoke(local, ["--state-dir", str(state), "down", "--name", REF.name])
    assert result.exit_code == 2 and "symbolic link" in result.output
    assert _files(victim) == before and (victim / "precious.txt").read_text() == "keep me"


def test_down_removes_links_inside_the_cluster_folder_not_their_targets(tmp_path):
    backend = LocalBackend(state_dir=tmp_path / "state")
    victim = _victim(tmp_path)
    before = _files(victim)
    with backend.supervisor.lock(REF, 5):
        backend.store.save(_record())
        folder = backend.store.cluster_dir(REF)
        (folder / "logs").symlink_to(victim)
        (folder / "scheduler.json").symlink_to(victim / "precious.txt")
    assert backend.down(REF)
    assert not os.path.lexists(folder)
    assert _files(victim) == before


def _record() -> ClusterRecord:
    """A cluster of one Small worker whose processes are all gone."""
    return ClusterRecord(ref=REF, host="127.0.0.1", worker_hw_tier="Small", desired=1)


def _write_record(backend: LocalBackend, **fields) -> Path:
    with backend.supervisor.lock(REF, 5):
        backend.store.save(_record())
    path = backend.store.cluster_dir(REF) / "cluster.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return path


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("desired", 1000000000, "an integer from 0 to 1000"),
        ("desired", -5, "an integer from 0 to 1000"),
        ("desired", "abc", "an integer from 0 to 1000"),
        ("port", 70000, "an integer from 0 to 65535"),
        ("workers", [{"name": "../../x", "pid": 1, "start": 1, "tier": "Small", "nthreads": 1, "memory_limit": 1}],
         "a worker name"),
        ("framework", {"temp_dir": "/etc"}, "ddlscale-ray-"),
        ("name", "other", "dask/steered, the cluster of its folder"),
    ],
)
def test_a_corrupt_cluster_record_starts_and_stops_nothing(local_state, field, value, allowed):
    backend = LocalBackend(state_dir=local_state)
    path = _write_record(backend, **{field: value})
    shown = "workers[0].name" if field == "workers" else "framework.temp_dir" if field == "framework" else (
        "kind/name/namespace" if field == "name" else field)
    for attempt in (lambda: backend.repair(REF, timeout=10), lambda: backend.scale(REF, 1, timeout=10),
                    lambda: backend.get_state(REF)):
        with pytest.raises(CorruptRecordError) as caught:
            attempt()
        assert caught.value.source == str(path) and caught.value.field == shown and allowed in str(caught.value)
    for args in (["status", "--name", REF.name, "--timeout", "10"], ["status", "--name", REF.name, "--repair"]):
        result = CliRunner().invoke(local, ["--state-dir", str(local_state.parent), *args])
        assert result.exit_code == 2, result.output
        assert str(path) in result.output and "corrupt record" in result.output
    assert processes_mentioning(str(local_state)) == []


def test_a_recorded_dask_tls_folder_other_than_the_clusters_own_is_refused(local_state):
    """The TLS files a client is handed come from the record: only the cluster's own folder is taken."""
    backend = LocalBackend(state_dir=local_state)
    path = _write_record(backend, framework={"tls_dir": "/etc"})
    for attempt in (lambda: backend.get_state(REF), lambda: backend.connection_env(REF)):
        with pytest.raises(CorruptRecordError) as caught:
            attempt()
        assert caught.value.source == str(path) and caught.value.field == "framework.tls_dir"
        assert str(backend.store.cluster_dir(REF) / "tls") in str(caught.value)


@pytest.mark.slow
def test_status_reports_a_dead_cluster_without_starting_anything_unless_asked_to_repair(local_state):
    backend = LocalBackend(state_dir=local_state)
    _write_record(backend)
    result = CliRunner().invoke(local, ["--state-dir", str(local_state.parent), "status", "--name", REF.name, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["status"], report["repaired"], report["existing_workers"]) == ("Failed", False, 0)
    assert processes_mentioning(str(local_state)) == []
    asked = CliRunner().invoke(
        local, ["--state-dir", str(local_state.parent), "status", "--name", REF.name, "--repair", "--json"]
    )
    assert asked.exit_code == 0, asked.output
    assert json.loads(asked.stdout)["repaired"] is True and processes_mentioning(str(local_state)) != []


def test_ray_temp_folders_are_private_and_never_a_predictable_shared_path(tmp_path):
    short = Path(tempfile.mkdtemp())
    try:
        # A cluster folder short enough for Ray's sockets keeps Ray's files inside it.
        assert ray_ops.temp_dir(short / "c") == str(short / "c" / "ray") and _mode(short / "c" / "ray") == 0o700
    finally:
        shutil.rmtree(short)
    deep = tmp_path / ("d" * 80)
    made = [Path(ray_ops.temp_dir(deep)) for _ in range(2)]
    try:
        assert made[0] != made[1] and all(_mode(m) == 0o700 and os.lstat(m).st_uid == os.geteuid() for m in made)
        assert all(m.parent == Path(tempfile.gettempdir()) and m.name.startswith("ddlscale-ray-") for m in made)
    finally:
        for folder in made:
            folder.rmdir()
