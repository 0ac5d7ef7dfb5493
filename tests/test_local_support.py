"""Fixtures and helpers shared by the local-backend tests (no tests here).

Every fixture tears its clusters down and then checks, by scanning /proc,
that no process started for the test's state directory is still running,
and that no thread was left behind in the test process.
"""
import os
import threading
import time
from pathlib import Path
from typing import Dict

import pytest

from tests.flyte_support import processes_mentioning  # noqa: F401 - the local tests import it from here

SMALL_TIERS = """
tiers:
  - name: Tiny
    cores: 1
    memory: 512Mi
  - name: Duo
    cores: 2.5
    memory: 768Mi
  - name: RayOnly
    cores: 1
    memory: 1Gi
    restrictTo: [ray]
"""


def descriptor_targets(pid: int) -> Dict[int, str]:
    """What each open descriptor of live process ``pid`` points at, by number (``/proc/<pid>/fd``).

    A descriptor the process closes between the listing and its read is left out (it points at nothing
    by then); a process that is gone raises :class:`FileNotFoundError`."""
    folder = Path(f"/proc/{pid}/fd")
    targets = {}
    for entry in folder.iterdir():
        try:
            targets[int(entry.name)] = os.readlink(entry)
        except FileNotFoundError:
            if not folder.exists():
                raise
    return targets


def wait_dead(proc, timeout: float = 10.0) -> None:
    """Wait until a killed process is gone (a SIGKILLed process needs a moment to exit)."""
    from flytekitplugins_ddlscale.backends.local import _procs as procs

    deadline = time.monotonic() + timeout
    while procs.is_alive(proc):
        assert time.monotonic() < deadline, f"process {proc.pid} still running after {timeout}s"
        time.sleep(0.02)


def scheduler_workers(address: str, cluster_dir: Path) -> Dict[str, dict]:
    """What the scheduler reports about its workers, by name, through a real dask Client holding the
    TLS certificate of the cluster whose folder is ``cluster_dir``."""
    from distributed import Client

    from flytekitplugins_ddlscale.backends.local._secrets import DaskTls

    with Client(address, timeout=10, security=DaskTls.of(cluster_dir).security()) as client:
        info = client.scheduler_info(n_workers=-1)
    return {w["name"]: w for w in info["workers"].values()}


@pytest.fixture
def local_state(tmp_path):
    """The local folder of a private state directory (``--state-dir`` is its parent); afterwards, no
    process may still run from it."""
    path = tmp_path / "state" / "local"
    threads_before = set(threading.enumerate())
    yield path
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    LocalBackend(state_dir=path).shutdown_all()
    leftover = processes_mentioning(str(path), environment=True)
    assert leftover == [], f"processes left running: {leftover}"
    # A closed dask Client stops its loop thread asynchronously: give it a moment.
    for thread in set(threading.enumerate()) - threads_before:
        thread.join(timeout=5)
    extra = [t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert extra == [], f"threads left running: {extra}"


@pytest.fixture
def tiers_file(tmp_path):
    """A user tiers file with Tiny (1 thread, 512Mi), Duo (2.5 cores, 768Mi) and a ray-only tier."""
    path = tmp_path / "tiers.yaml"
    path.write_text(SMALL_TIERS)
    return path


@pytest.fixture
def backend(local_state):
    """A LocalBackend on the private state directory with the packaged tiers."""
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    return LocalBackend(state_dir=local_state, stop_grace=5.0)
