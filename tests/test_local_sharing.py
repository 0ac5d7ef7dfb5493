"""Separate processes share one local cluster through the state directory."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flytekitplugins_ddlscale import ClusterRef, ConflictError
from flytekitplugins_ddlscale.backends.local import LocalBackend, _procs as procs
from tests.test_local_support import backend, local_state, processes_mentioning, scheduler_workers  # noqa: F401

CHILD = textwrap.dedent(
    """
    import json, sys
    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    backend = LocalBackend(state_dir=sys.argv[1])
    ref = ClusterRef("dask", "shared")
    before = backend.get_state(ref)
    after = backend.scale(ref, 2, timeout=120).final
    print(json.dumps({"before": before.ready_workers, "after": after.ready_workers,
                      "env": backend.connection_env(ref)}))
    """
)
DDLSCALE = str(Path(sys.executable).with_name("ddlscale"))


@pytest.mark.slow
def test_a_second_process_scales_the_same_cluster_and_its_workers_outlive_it(backend):
    ref = ClusterRef("dask", "shared")
    backend.scale(ref, 1, timeout=60)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(backend.store.root)],
        capture_output=True, text=True, timeout=180, check=True,
    )
    child = json.loads(out.stdout.strip().splitlines()[-1])
    assert (child["before"], child["after"]) == (1, 2)
    assert child["env"] == backend.connection_env(ref)

    # The child has exited; the worker it started still runs and is seen by the scheduler.
    state = backend.get_state(ref)
    assert (state.ready_workers, state.existing_workers) == (2, 2)
    record = backend.store.load(ref)
    assert all(procs.is_alive(w.proc) for w in record.workers)
    assert sorted(scheduler_workers(record.address, backend.store.cluster_dir(ref))) == sorted(w.name for w in record.workers)

    # The CLI, a third process, reports the same cluster.
    cli = subprocess.run(
        [DDLSCALE, "local", "--state-dir", str(backend.store.root.parent), "status", "--name", "shared", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    report = json.loads(cli.stdout)
    assert (report["ready_workers"], report["repaired"], report["address"]) == (2, False, record.address)
    assert sorted(w["pid"] for w in report["workers"]) == sorted(w.proc.pid for w in record.workers)


def test_a_change_waits_for_the_lock_and_gives_up_at_its_timeout(backend):
    ref = ClusterRef("dask", "locked")
    other = LocalBackend(state_dir=backend.store.root)
    with backend.store.lock(ref, timeout=5):
        with pytest.raises(ConflictError, match="kept the lock on local cluster dask/locked"):
            other.scale(ref, 1, timeout=0.3)
    assert other.list_clusters() == []
    assert processes_mentioning(str(backend.store.root)) == []


def test_state_dir_defaults_under_ddlscale_state_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "x"))
    assert LocalBackend().store.root == tmp_path / "x" / "local"
    assert os.path.isdir(tmp_path / "x" / "local" / "clusters")
