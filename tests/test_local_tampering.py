"""A local cluster is safe from where its user stands and from what its records say.

- Nothing is imported from the caller's working directory: a poisoned ``inspect.py`` (and modules
  named after what a Dask process imports) left there is never run by the cluster's processes.
- A tampered or broken ``cluster.json`` (nested 1,000 deep, a directory or a FIFO in its place, a
  host off loopback or one that needs DNS, a pid of an unrelated process) is refused with one line;
  ``list`` and ``down --all`` still see and stop every other cluster; no process is signalled unless
  its environment carries the cluster's mark (the folder's real path).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.local import LocalBackend
from tests.test_local_support import local_state  # noqa: F401  (fixture)

DDLSCALE = str(Path(sys.executable).parent / "ddlscale")
POISON = 'open({sentinel!r}, "a").write(__name__ + "\\n")\nraise SystemExit("poisoned module imported")\n'


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
