"""Fixtures and helpers for the Flyte-surface tests (tasks, phase, connector, examples).

Import the fixtures into a test module with ``from tests.flyte_support import local_env``.
"""
import os
from pathlib import Path
from typing import List

import pytest

SCALER_ENV = ("CLUSTER_SCALER_BASE_URL", "DOMINO_RUN_ID", "DDLSCALE_BACKEND", "DOMINO_API_PROXY",
              "DOMINO_TOKEN", "DOMINO_API_KEY", "DASK_SCHEDULER_SERVICE_HOST", "DASK_SCHEDULER_SERVICE_PORT")


def processes_mentioning(text: str, environment: bool = False) -> List[int]:
    """Pids of live processes whose command line contains ``text`` (local clusters name their state dir);
    with ``environment``, also those whose environment does (a Ray node's processes carry the path of the
    cluster's token file, inside the state dir, but name only Ray's temp folder on their command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text()
            environ = (entry / "environ").read_bytes().decode(errors="replace") if environment else ""
        except OSError:
            continue
        if (text in cmdline or text in environ) and "State:\tZ" not in status:
            found.append(int(entry.name))
    return found


@pytest.fixture
def local_env(tmp_path, monkeypatch):
    """Nothing configured except a private state dir: ``get_backend()`` picks the local backend.

    Yields the state dir; afterwards takes every local cluster down and fails
    the test if any of its processes is still alive.
    """
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    for name in SCALER_ENV:
        monkeypatch.delenv(name, raising=False)
    state = tmp_path / "state"
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(state))
    yield state
    LocalBackend(state_dir=state / "local").shutdown_all()
    leftovers = processes_mentioning(str(state))
    assert not leftovers, f"processes left running: {leftovers}"


def local_backend(state: Path):
    """A LocalBackend on the fixture's state dir (the one ``get_backend()`` picks there)."""
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    return LocalBackend(state_dir=state / "local")
