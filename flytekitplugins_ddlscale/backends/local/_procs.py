"""Detached OS processes: start them, tell whether they still run, stop them.

A cluster process outlives the process that started it (backgrounded by a short-lived ``sh``), is recorded
by pid and start time, and carries :data:`CLUSTER_MARK_ENV` (its cluster's folder) with the allow-listed
environment (:func:`~._process_env.cluster_environment`). Only a process of the owner carrying the mark is
ever signalled (:func:`stop_processes`), whatever a record says.
"""
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import psutil

from ..._core import settings
from ..._core.leases import ENDED, process_start as start_time
from ..._core.waiting import probe_timeout
from ...errors import BackendUnavailableError, UnsafePathError
from .._support.privatefs import open_nofollow, private_dir, read_text_nofollow
from ._process_env import cluster_environment

# The log is opened here, not by the shell, so a symbolic link in its place is refused: it is the
# shell's stderr, and the command's stdout and stderr.
_SPAWN_SCRIPT = '"$@" >&2 </dev/null & echo $!'
_POLL = 0.05
_SETTLE = 0.5
logger = logging.getLogger("flytekitplugins_ddlscale.local")
CLUSTER_MARK_ENV = settings.LOCAL_CLUSTER.name
"""Set in every cluster process's environment to its cluster's folder (inherited by what it starts)."""
RAY_TITLE = "ray::"
"""How Ray's own processes title themselves (over their command line and environment)."""


@dataclass(frozen=True)
class Mark:
    """What tells a cluster's processes: ``CLUSTER_MARK_ENV=<path>`` in their environment, and their owner."""

    path: str
    """The real path of the cluster's folder (the same folder reached through a link has the same mark)."""
    uid: int
    """The folder's owner: only that user's processes are the cluster's."""

    @classmethod
    def of(cls, folder: Path) -> "Mark":
        """The mark of the cluster whose folder is ``folder`` (owned by this user when it does not exist)."""
        try:
            uid = os.lstat(folder).st_uid
        except FileNotFoundError:
            uid = os.geteuid()
        return cls(os.path.realpath(folder), uid)

    def carried_by(self, pid: int) -> bool:
        """Whether process ``pid`` is its owner's (real and effective uid) and its environment carries this
        mark (as its real path: a process started through a linked path of the same folder counts)."""
        return self.verdict(pid) is True

    def verdict(self, pid: int) -> Optional[bool]:
        """From one read of process ``pid``: True when it carries this mark, False when it does not or is
        another user's, None when it cannot show it now (gone, a zombie, or an empty environment while it
        execs the next program of its chain or a JVM tears down)."""
        try:
            process = psutil.Process(pid)
            real, effective, _ = process.uids()
            if real != self.uid or effective != self.uid:
                return False
            if process.status() in ENDED:
                return None
            environment = process.environ()
        except psutil.AccessDenied:
            return False  # ours by uid yet unreadable: nothing proves it is the cluster's
        except psutil.Error:
            return None
        value = environment.get(CLUSTER_MARK_ENV)
        if value is None and self._retitled_here(process):
            return True
        if not environment:
            return None
        return value is not None and (
            value == self.path or (os.path.isabs(value) and os.path.realpath(value) == self.path)
        )

    def _retitled_here(self, process: psutil.Process) -> bool:
        """Whether ``process`` is one of Ray's own (``ray::DashboardAgent``...) running in this cluster's folder:
        Ray titles its processes over their command line and environment, hiding the mark, and an orphaned
        agent lingers a minute outside any recorded group; every cluster process starts in its folder."""
        try:
            title = process.cmdline()
            return bool(title) and title[0].startswith(RAY_TITLE) and os.path.realpath(process.cwd()) == self.path
        except psutil.Error:
            return False


@dataclass(frozen=True)
class ProcessId:
    """A process as recorded in the state directory: pid plus start time in clock ticks since boot
    (:func:`start_time`: ``leases.process_start``, the unit every version has recorded)."""

    pid: int
    start: int

    def to_json(self) -> Dict[str, int]:
        """The fields stored in the state file."""
        return {"pid": self.pid, "start": self.start}


def _running(where: Callable[[int], bool]) -> List[ProcessId]:
    """The running processes whose pid ``where`` holds for (not those it raises ``OSError`` for)."""
    found = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError):
            started = start_time(pid) if where(pid) else None
            if started is not None:
                found.append(ProcessId(pid, started))
    return found


def group_members(proc: ProcessId) -> List[ProcessId]:
    """The other running processes of ``proc``'s process group (its own, from :func:`spawn_detached`):
    what it started, such as Ray's raylet and gcs_server. Empty when ``proc`` is not running."""
    try:
        group = os.getpgid(proc.pid)  # read before the identity check, so it cannot be a reused pid's
    except OSError:
        return []
    return _running(lambda pid: pid != proc.pid and os.getpgid(pid) == group) if is_alive(proc) else []


def marked_processes(mark: Mark) -> List[ProcessId]:
    """The running processes that carry ``mark`` (a cluster's processes and what they started), this
    process excepted."""
    return _running(lambda pid: pid != os.getpid() and mark.carried_by(pid))


def belongs_to(proc: ProcessId, owners: Iterable[ProcessId]) -> bool:
    """Whether ``proc`` is one of ``owners``, in the session of one (each started by
    :func:`spawn_detached` in a session of its own), or started by one."""
    owners = [owner for owner in owners if is_alive(owner)]
    if proc in owners:
        return True
    sessions = set()
    for owner in owners:
        with contextlib.suppress(OSError):
            sessions.add(os.getsid(owner.pid))
    try:
        if os.getsid(proc.pid) in sessions:
            return True
        # parents() follows a parent pid only to a process started before its child, never a reused pid.
        return any(parent.pid in {owner.pid for owner in owners} for parent in psutil.Process(proc.pid).parents())
    except (OSError, psutil.Error):
        return False


def is_alive(proc: ProcessId) -> bool:
    """Whether the recorded process is still the running process with that pid."""
    return start_time(proc.pid) == proc.start


def with_environment(variables: Dict[str, str], argv: List[str]) -> List[str]:
    """``argv`` run through ``env`` with ``variables`` set on top of the environment :func:`spawn_detached`
    gives (``env`` execs: the recorded pid is the command's)."""
    return [shutil.which("env") or "/usr/bin/env", *(f"{name}={value}" for name, value in variables.items()), *argv]


def python_module(module: str) -> List[str]:
    """``python -m module`` in this interpreter, in safe-path mode (3.11+: ``-P``): no folder goes before the
    installed packages on ``sys.path``."""
    return [*_safe_python(), "-m", module]


def _safe_python() -> List[str]:
    return [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else [])]


def spawn_detached(argv: List[str], log_path: Path, mark: Mark, cwd: Path) -> ProcessId:
    """Start ``argv`` detached in ``cwd`` with the cluster's environment and ``mark``, appending its output to
    ``log_path`` (in a private folder, never opened through a link: :class:`UnsafePathError`)."""
    log = _open_log(log_path)
    try:
        out = subprocess.run(
            ["/bin/sh", "-c", _SPAWN_SCRIPT, "sh", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            cwd=cwd,
            env={**cluster_environment(), CLUSTER_MARK_ENV: mark.path},
            check=True,
            timeout=30,
        )
        pid = int(out.stdout.decode().strip())
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise BackendUnavailableError(f"could not start {argv[0]}: {exc}") from None
    finally:
        os.close(log)
    return _started(pid, ' '.join(argv[:4]), log_path)


def _open_log(log_path: Path) -> int:
    """A descriptor appending to ``log_path``, in a private folder, never opened through a link."""
    private_dir(log_path.parent)
    return open_nofollow(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def _started(pid: int, what: str, log_path: Path) -> ProcessId:
    """The identity of the process ``pid`` just started; :class:`BackendUnavailableError` quoting its log
    when it has already exited."""
    started = start_time(pid)
    if started is None:
        raise BackendUnavailableError(f"{what} exited at once; see {log_path}:\n{log_tail(log_path)}")
    return ProcessId(pid, started)


def stop_processes(procs: Iterable[ProcessId], mark: Mark, grace: float = 5.0, asked: bool = False) -> None:
    """Make every process of ``procs`` that carries ``mark`` exit: SIGTERM to all, SIGKILL to those running
    ``grace`` s later (cut to what is left of the operation); one that does not carry it is left alone with a
    warning. ``asked``: they were told to exit already (a Dask retire), so they get ``grace`` s first (a
    SIGTERM mid-shutdown can stall a Dask worker). What they started in their process groups and still
    runs a second after them is stopped too. :class:`BackendUnavailableError` names any still running 5 s
    after SIGKILL."""
    pending, leaving = [], []
    for proc in procs:
        if not is_alive(proc):
            continue
        verdict = _settled_verdict(mark, proc)
        if verdict is None:  # on its way out, it shows no environment to check: awaited, not signalled
            leaving.append(proc)
        elif verdict:
            pending.append(proc)
        else:
            logger.warning("process %d is not one of cluster %s (no %s=%s in its environment, or another "
                           "user's): not signalled", proc.pid, mark.path, CLUSTER_MARK_ENV, mark.path)
    started_by_them = [m for p in pending for m in group_members(p) if mark.carried_by(m.pid)]
    _signal_until_gone(pending, grace, asked)
    _signal_until_gone(started_by_them, 1.0, asked=True)
    deadline = time.monotonic() + grace + 5.0
    while any(is_alive(p) for p in leaving) and time.monotonic() < deadline:
        time.sleep(_POLL)


def _settled_verdict(mark: Mark, proc: ProcessId) -> Optional[bool]:
    """:meth:`Mark.verdict` of ``proc`` once it shows one: a process between two programs of its chain
    shows an empty environment for an instant, so it is asked again for up to :data:`_SETTLE` s; one that
    still shows none (a JVM tearing down) is on its way out (None)."""
    deadline = time.monotonic() + _SETTLE
    while True:
        verdict = mark.verdict(proc.pid)
        if verdict is not None or not is_alive(proc) or time.monotonic() >= deadline:
            return verdict
        time.sleep(_POLL)


def _signal_until_gone(procs: List[ProcessId], grace: float, asked: bool) -> None:
    pending = list(procs)
    steps: List[Tuple[Optional[signal.Signals], float]] = [(signal.SIGTERM, grace), (signal.SIGKILL, 5.0)]
    if asked:
        steps.insert(0, (None, grace))
    for sig, wait in steps:
        # The same processes as checked above: a pid with its start time names one process.
        pending = [p for p in pending if is_alive(p)]
        if not pending:
            return
        for proc in pending if sig is not None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
        if sig is not signal.SIGKILL:
            wait = probe_timeout(wait, f"the exit of processes {[p.pid for p in pending]}")
        deadline = time.monotonic() + wait
        while pending and time.monotonic() < deadline:
            pending = [p for p in pending if is_alive(p)]
            if pending:
                time.sleep(_POLL)
    if pending:
        raise BackendUnavailableError(
            f"processes {[p.pid for p in pending]} did not exit after SIGKILL"
        )


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        text = read_text_nofollow(path)
    except FileNotFoundError:
        return f"(no log at {path})"
    except UnsafePathError as exc:
        return f"(log not read: {exc.message})"
    return "\n".join(text.splitlines()[-lines:])
