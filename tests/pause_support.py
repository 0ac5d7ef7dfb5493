"""Run a real ``ddlscale`` command that stops at a named point, for crash tests (and the concurrency benchmark).

The package's points (``flytekitplugins_ddlscale._core.lifetime``) do nothing unless a hook is added in
the process, so this file is also the launcher: run as a script, it adds a hook and then runs the
``ddlscale`` command line with the arguments it was given. The first time the command reaches the point,
the hook writes ``<point> <pid>`` to a pipe the test reads, and blocks reading another pipe until the test
closes it (:meth:`Pause.resume`) or kills the command. Both sides wait on the pipes: no file is polled, no
clock is raced. Later visits of the point go on at once.
"""
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

SCRIPT = str(Path(__file__).resolve())


class Pause:
    """One command run that pauses at ``point``: :meth:`popen` starts it, :meth:`wait` waits until it paused."""

    def __init__(self, point: str) -> None:
        self.point = point
        self._paused_read, self._paused_write = os.pipe()
        self._resume_read, self._resume_write = os.pipe()
        self._said = b""

    def argv(self, *args: str) -> List[str]:
        """The command line of ``ddlscale *args`` pausing at the point (its fds are passed by :meth:`popen`)."""
        return [sys.executable, SCRIPT, self.point, str(self._paused_write), str(self._resume_read), "--", *args]

    def popen(self, args: List[str], **options: Any) -> "subprocess.Popen[str]":
        """Start ``ddlscale *args`` (``options`` go to Popen) and keep only this side's ends of the pipes."""
        proc = subprocess.Popen(self.argv(*args), pass_fds=(self._paused_write, self._resume_read), **options)
        self.child_started()
        return proc

    @property
    def fds(self) -> tuple:
        """The descriptors the command must inherit (for a caller that starts it through a shell)."""
        return (self._paused_write, self._resume_read)

    def child_started(self) -> None:
        """Close the command's ends here, so its exit reads as the end of the pipe (call once it started)."""
        for fd in (self._paused_write, self._resume_read):
            os.close(fd)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until the command paused at the point; False when it exited first."""
        ends = time.monotonic() + timeout
        while b"\n" not in self._said:
            left = ends - time.monotonic()
            assert left > 0, f"the command did not reach {self.point} within {timeout:.0f}s"
            ready, _, _ = select.select([self._paused_read], [], [], left)
            if ready:
                chunk = os.read(self._paused_read, 256)
                if not chunk:
                    return False
                self._said += chunk
        return True

    def paused(self) -> bool:
        """Whether the command has paused at the point (without waiting)."""
        if b"\n" not in self._said and select.select([self._paused_read], [], [], 0)[0]:
            self._said += os.read(self._paused_read, 256) or b"\n-exited"
        return self._said.endswith(b"\n") and not self._said.endswith(b"-exited")

    def resume(self) -> None:
        """Let the paused command go on."""
        os.close(self._resume_write)
        self._resume_write = -1

    def close(self) -> None:
        """Release this side's pipes."""
        for fd in (self._paused_read, self._resume_write):
            if fd >= 0:
                os.close(fd)
        self._paused_read = self._resume_write = -1


def kill_once_paused(proc: "subprocess.Popen[str]", pause: Pause, before_kill: Optional[Any] = None,
                     timeout: float = 120.0) -> None:
    """SIGKILL ``proc`` once it paused at ``pause``'s point; ``before_kill`` looks at the world first. Fails if it
    exits before getting there or does not get there within ``timeout``; ``proc`` never outlives this call."""
    try:
        assert pause.wait(timeout), f"exited before pausing at {pause.point}: {proc.communicate(timeout=30)}"
        if before_kill is not None:
            before_kill()
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        pause.close()


def _main(argv: List[str]) -> None:
    point, paused_fd, resume_fd, dash, *args = argv
    assert dash == "--", "usage: pause_support.py POINT PAUSED_FD RESUME_FD -- DDLSCALE_ARGS..."
    from flytekitplugins_ddlscale._core.lifetime import add_pause_hook
    from flytekitplugins_ddlscale.cli import main

    reached = []

    def hook(name: str) -> None:
        if name != point or reached:
            return
        reached.append(name)
        os.write(int(paused_fd), f"{name} {os.getpid()}\n".encode())
        os.read(int(resume_fd), 1)  # blocks until the test closes its end (or kills this process)

    add_pause_hook(hook)
    main(args, prog_name="ddlscale")


if __name__ == "__main__":
    _main(sys.argv[1:])
