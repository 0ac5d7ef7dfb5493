"""Detached OS processes: start them, tell whether they still run, stop them.

Cluster processes must outlive the Python process that started them, so
separate tasks and the CLI can share one cluster. They are started through a
short-lived ``sh`` that backgrounds them: the cluster process is re-parented
away from us at once, so it never becomes our zombie and Python never warns
about a child it did not wait for. A pid is recorded together with the
process start time, because pids are reused and a bare pid could name an
unrelated process after a reboot or a long idle. Every cluster process
starts with :func:`~.process_env.cluster_environment`, never this process's
whole environment (its credentials), plus :data:`CLUSTER_MARK_ENV`: the
cluster's folder (its real path: :class:`Mark`), which every process it starts inherits, so the
processes of a cluster can be found by a scan of ``/proc`` whatever its record says
(:func:`marked_processes`). No process is signalled on a record's word alone:
:func:`stop_processes` signals only processes of the cluster's owner whose
environment carries its mark, so a record naming an unrelated pid (with its
start time) gets nothing killed, and root's ``down`` never touches another
user's process that names root's folder.

Nothing is loaded from where the caller stands: every cluster process
starts in its cluster's private folder (never the caller's working
directory, which ``python -m`` would put first on ``sys.path``), and the
plugin's own ``python -m`` commands run in safe-path mode
(:func:`python_module`).
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
from typing import Dict, Iterable, List, Optional, Tuple

from ..._core import settings
from ..._core.waiting import probe_timeout
from ...errors import BackendUnavailableError, UnsafePathError
from .._support.privatefs import open_nofollow, private_dir, read_text_nofollow
from ._process_env import cluster_environment

# The log is opened here, not by the shell, so a symbolic link in its place is refused: it is the
# shell's stderr, and the command's stdout and stderr.
_SPAWN_SCRIPT = '"$@" >&2 </dev/null & echo $!'
_POLL = 0.05
logger = logging.getLogger("flytekitplugins_ddlscale.local")
CLUSTER_MARK_ENV = settings.LOCAL_CLUSTER.name
"""Set in every cluster process's environment to its cluster's folder (inherited by what it starts)."""


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
        """Whether process ``pid`` is its owner's and its environment carries this mark (as its real path:
        a process started through a linked path of the same folder counts)."""
        try:
            if os.stat(f"/proc/{pid}").st_uid != self.uid:
                return False
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        prefix = f"{CLUSTER_MARK_ENV}=".encode()
        for entry in environ.split(b"\0"):
            if entry.startswith(prefix):
                value = os.fsdecode(entry[len(prefix):])
                return value == self.path or (os.path.isabs(value) and os.path.realpath(value) == self.path)
        return False


@dataclass(frozen=True)
class ProcessId:
    """A process as recorded in the state directory: pid plus start time in clock ticks."""

    pid: int
    start: int

    def to_json(self) -> Dict[str, int]:
        """The fields stored in the state file."""
        return {"pid": self.pid, "start": self.start}


def _stat(pid: int) -> Optional[List[str]]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name in parentheses may contain spaces; fields follow the last ')'.
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> Optional[int]:
    """The start time of ``pid`` (clock ticks since boot), or None if it is not running.

    Zombies count as not running once they have fully exited and only wait
    to be reaped. A multi-threaded process shows its main thread as a zombie
    while other threads still tear down and hold its sockets open, so it
    counts as running until only the main thread is left.
    """
    fields = _stat(pid)
    if fields is None:
        return None
    try:
        if fields[0] in ("Z", "X") and len(os.listdir(f"/proc/{pid}/task")) <= 1:
            return None
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return int(fields[19])


def exiting(pid: int) -> bool:
    """Whether ``pid``'s main thread has exited while other threads tear down (its environment then reads
    empty), or it is gone."""
    fields = _stat(pid)
    return fields is None or fields[0] in ("Z", "X")


def group_members(proc: ProcessId) -> List[ProcessId]:
    """The other running processes of ``proc``'s process group (its own, from :func:`spawn_detached`):
    what it started, such as Ray's raylet and gcs_server. Empty when ``proc`` is not running."""
    fields = _stat(proc.pid)
    if fields is None or not is_alive(proc):
        return []
    group = fields[2]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == proc.pid:
            continue
        other = _stat(int(entry))
        if other is not None and other[2] == group and other[0] not in ("Z", "X"):
            members.append(ProcessId(int(entry), int(other[19])))
    return members


def marked_processes(mark: Mark) -> List[ProcessId]:
    """The running processes that carry ``mark`` (a cluster's processes and what they started), this
    process excepted."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or not mark.carried_by(int(entry)):
            continue
        started = start_time(int(entry))
        if started is not None:
            found.append(ProcessId(int(entry), started))
    return found


def belongs_to(proc: ProcessId, owners: Iterable[ProcessId]) -> bool:
    """Whether ``proc`` is one of ``owners``, in the session of one (each started by
    :func:`spawn_detached` in a session of its own), or started by one."""
    owners = [owner for owner in owners if is_alive(owner)]
    if proc in owners:
        return True
    sessions = {fields[3] for fields in (_stat(owner.pid) for owner in owners) if fields is not None}
    pids = {owner.pid for owner in owners}
    fields = _stat(proc.pid)
    if fields is not None and fields[3] in sessions:
        return True
    seen = set()
    while fields is not None and fields[1] not in ("0", "1") and fields[1] not in seen:
        seen.add(fields[1])
        if int(fields[1]) in pids:
            return True
        fields = _stat(int(fields[1]))
    return False


def is_alive(proc: ProcessId) -> bool:
    """Whether the recorded process is still the running process with that pid."""
    return start_time(proc.pid) == proc.start


def with_environment(variables: Dict[str, str], argv: List[str]) -> List[str]:
    """``argv`` run through ``env`` with ``variables`` set on top of the environment it starts with
    (:func:`spawn_detached`'s: the allow-listed :func:`~.process_env.cluster_environment`).

    ``env`` execs the command, so the pid :func:`spawn_detached` records is the command's own.
    """
    return [shutil.which("env") or "/usr/bin/env", *(f"{name}={value}" for name, value in variables.items()), *argv]


def python_module(module: str) -> List[str]:
    """``python -m module`` in this interpreter, in safe-path mode where Python has it (3.11+: ``-P``), so
    no folder is put before the installed packages on ``sys.path``: not even the private folder it starts in."""
    return [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-m", module]


def spawn_detached(argv: List[str], log_path: Path, mark: Mark, cwd: Path) -> ProcessId:
    """Start ``argv`` detached from this process in the folder ``cwd``, appending its output to ``log_path``.

    It starts with :func:`~.process_env.cluster_environment` (the allow-listed variables of this
    process, no credentials) and ``CLUSTER_MARK_ENV=<mark>`` (its cluster's folder's real path), plus what
    ``argv`` sets itself through :func:`with_environment`.
    The log's folder is private and the log is never opened through a link (:class:`UnsafePathError`).
    """
    private_dir(log_path.parent)
    log = open_nofollow(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
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
    started = start_time(pid)
    if started is None:
        raise BackendUnavailableError(
            f"{' '.join(argv[:4])} exited at once; see {log_path}:\n{log_tail(log_path)}"
        )
    return ProcessId(pid, started)


def stop_processes(procs: Iterable[ProcessId], mark: Mark, grace: float = 5.0, asked: bool = False) -> None:
    """Make every process that carries ``mark`` exit: SIGTERM, then SIGKILL for those still running after
    ``grace`` s. A process that does not carry it is never signalled (a record named it, not the cluster):
    it is left alone with a warning.

    ``asked`` means they were already told to exit (a Dask retire or their
    scheduler closing): they first get ``grace`` seconds to finish on their
    own, because a SIGTERM that lands mid-shutdown can stall a Dask worker.
    Signals go to all processes before any wait, so stopping N takes one
    grace period, not N. Inside an operation
    (:func:`~flytekitplugins_ddlscale._core.waiting.within`) each grace is cut to what is
    left of it: a process that ignores SIGTERM (stopped, hung) is killed at the operation's end. What each process had started in its process group
    (:func:`group_members`, read before any signal) and still runs a second
    after the process is gone gets SIGTERM, then SIGKILL a second later: a
    framework process killed after its grace cannot clean up behind itself. Raises
    :class:`BackendUnavailableError` naming the pids still running 5 s after
    SIGKILL.
    """
    pending, leaving = [], []
    for proc in procs:
        if not is_alive(proc):
            continue
        if exiting(proc.pid):  # on its way out, it shows no environment to check: awaited, not signalled
            leaving.append(proc)
        elif mark.carried_by(proc.pid):
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
