"""Run a command as a child process, forwarding SIGTERM and SIGINT to it while it runs.

A job runner stops a job by signalling its main process: the command gets the signal, and the cluster
is restored only once it has exited (killed ``kill_after`` seconds after the first forwarded signal, so
the restore runs within the runner's grace period). On Linux the command also dies with ``ddlscale``
(``PR_SET_PDEATHSIG``), as its claim does.
"""
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import threading
from types import FrameType
from typing import Any, Callable, Dict, List, Optional, Sequence

logger = logging.getLogger("flytekitplugins_ddlscale")

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_KILL_AFTER = 10.0
"""Seconds a command gets to exit after a forwarded signal before it is killed."""
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


class CommandNotStarted(Exception):
    """The command could not be started; ``exit_code`` is the shell's (127 not found, 126 not executable)."""

    def __init__(self, argv: Sequence[str], error: OSError) -> None:
        self.exit_code = EXIT_NOT_FOUND if isinstance(error, FileNotFoundError) else EXIT_NOT_EXECUTABLE
        super().__init__(f"cannot run {argv[0]!r}: {error.strerror or error}")


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the calling process gets when its parent thread exits."""


def die_with_parent() -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process dies (Linux), else None; a
    parent that died between the fork and the ``prctl`` is caught by its pid (the child exits at once).
    Only the command itself is covered, not what it starts in the background."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(EXIT_PARENT_GONE)

    return preexec


EXIT_PARENT_GONE = 137
"""The command's status when ``ddlscale`` died before it could start: as if killed by SIGKILL."""


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: its code, or 128 + N when signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode


def _terminal_sends_sigint_to_child() -> bool:
    # Ctrl-C on a terminal signals the whole foreground process group, which
    # includes the child; forwarding it again would interrupt the child twice.
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.isatty():
                return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError):
            continue
    return False


class _Forwarder:
    """Signal handlers that pass signals on to the child and arm the kill timer."""

    def __init__(self, kill_after: float) -> None:
        self.kill_after = kill_after
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.pending: List[int] = []
        """Signals that arrived before the child existed."""
        self._skip_sigint = _terminal_sends_sigint_to_child()
        self._timer: Optional[threading.Timer] = None
        self._previous: Dict[int, Any] = {}

    def install(self) -> None:
        for signum in FORWARDED_SIGNALS:
            self._previous[signum] = signal.signal(signum, self.handle)

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()

    def handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.proc is None:
            self.pending.append(signum)
        else:
            self.forward(signum)

    def forward(self, signum: int) -> None:
        assert self.proc is not None
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self._skip_sigint:
            logger.warning("%s: the terminal sent it to the command as well; waiting for the command to exit", name)
        else:
            logger.warning("%s received: passing it on to the command (pid %d)", name, self.proc.pid)
            self.proc.send_signal(signum)
        if self._timer is None:
            self._timer = threading.Timer(self.kill_after, self._kill)
            self._timer.daemon = True
            self._timer.start()

    def _kill(self) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            logger.warning(
                "the command (pid %d) did not exit within %gs of the signal; killing it", self.proc.pid, self.kill_after
            )
            self.proc.kill()


def run_forwarding(argv: Sequence[str], kill_after: float = DEFAULT_KILL_AFTER) -> int:
    """Run ``argv`` with this process's environment and streams; its exit status. SIGTERM and SIGINT are
    passed on to it (SIGINT unless the terminal delivered it already), and it is killed ``kill_after``
    seconds after the first, or when this process dies (Linux); the previous handlers are back when this
    returns. :class:`CommandNotStarted` when ``argv`` cannot be executed."""
    forwarder = _Forwarder(kill_after)
    # Installed before the child exists, so a signal in between is not lost:
    # it is forwarded as soon as the child has started.
    forwarder.install()
    try:
        try:
            forwarder.proc = subprocess.Popen(list(argv), preexec_fn=die_with_parent())
        except OSError as error:
            raise CommandNotStarted(argv, error) from None
        for signum in forwarder.pending:
            forwarder.forward(signum)
        return exit_status(forwarder.proc.wait())
    finally:
        forwarder.uninstall()
