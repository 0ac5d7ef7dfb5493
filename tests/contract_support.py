"""Helpers for the contract and crash tests: run a printed command as a user would, kill one where it paused
(no tests here)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Optional

OUTER_ENV = ("DOMINO_API_PROXY", "DOMINO_TOKEN", "DOMINO_API_KEY", "DOMINO_RUN_ID", "DDLSCALE_BACKEND",
             "CLUSTER_SCALER_BASE_URL", "DOMINO_STARTING_USER_ID", "KUBECONFIG", "DDLSCALE_TIERS_FILE",
             "DDLSCALE_STATE_DIR", "KUBERNETES_SERVICE_HOST")
"""Settings that would point the command elsewhere: the command itself must carry what it needs."""


def run_shell(command: str, timeout: float = 120.0, **env: str) -> subprocess.CompletedProcess:
    """Run ``command`` exactly as printed, in bash, with this venv's ``ddlscale`` first on PATH.

    Only ``env`` is added to a clean environment (credentials a user would
    have exported, never part of a printed command).
    """
    return subprocess.run(
        ["bash", "-c", command], env=shell_environment(**env), capture_output=True, text=True, timeout=timeout,
        check=False,
    )


def shell_environment(**env: str) -> Dict[str, str]:
    """A clean environment (none of :data:`OUTER_ENV`) with this venv's ``ddlscale`` first on PATH, plus ``env``."""
    environment = {k: v for k, v in os.environ.items() if k not in OUTER_ENV}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    environment.update(env)
    return environment


def kill_once_marked(
    proc: subprocess.Popen, marker: Path, what: str, before_kill: Optional[Callable[[], None]] = None,
    timeout: float = 120.0,
) -> None:
    """SIGKILL ``proc`` once it wrote ``marker`` (it paused at ``what``); ``before_kill`` looks at the world
    first. Fails if it never gets there within ``timeout``; ``proc`` never outlives this call."""
    try:
        ends = time.monotonic() + timeout
        while not (marker.exists() and marker.read_text().strip()) and proc.poll() is None:
            assert time.monotonic() < ends, f"never paused at {what}"
            time.sleep(0.05)
        assert marker.exists(), proc.communicate(timeout=30)
        if before_kill is not None:
            before_kill()
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """A kubeconfig for the Kubernetes test server at ``server_url``."""
    config: Dict[str, object] = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "k", "cluster": {"server": server_url}}],
        "users": [{"name": "u", "user": {"token": "test-token-1234"}}],
        "contexts": [{"name": "test", "context": {"cluster": "k", "user": "u"}}],
    }
    path.write_text(json.dumps(config))
    return path


def _holds_a_lock(pid: int) -> bool:
    """Whether process ``pid`` holds a file lock (``/proc/locks``)."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[4] == str(pid) for line in lines if len(line.split()) > 4)


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()[0] in ("T", "t")


def stop_outside_locks(pid: int, timeout: float = 60.0) -> None:
    """SIGSTOP ``pid`` at a moment it holds no file lock: stopped inside one of its locked steps (a
    renewal holds the record lock for milliseconds) it would hold up every other process until it runs
    again, which is not the stall these tests stage. Each retry waits for its lock to be released."""
    ends = time.monotonic() + timeout
    while True:
        os.kill(pid, signal.SIGSTOP)
        while not _stopped(pid):  # the signal is delivered asynchronously
            assert time.monotonic() < ends, f"process {pid} did not stop within {timeout}s"
            time.sleep(0.01)
        if not _holds_a_lock(pid):
            return
        os.kill(pid, signal.SIGCONT)
        while _holds_a_lock(pid):
            assert time.monotonic() < ends, f"process {pid} held a lock for {timeout}s"
            time.sleep(0.01)
