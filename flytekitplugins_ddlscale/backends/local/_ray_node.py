"""The two programs a local Ray node runs as, each run by path (the standard library only: importing the
plugin would slow every start); docs/local.md, Security and Ray.

``python ray_node.py start ...``: Ray's ``ray start`` held to loopback (``resolve_ip_for_localhost`` keeps
a loopback address in this process); a Ray without that hook is refused (exit 3, saying why).

``python ray_node.py READY_FILE [--head PID:START] -- COMMAND...``: one worker node that waits (up to
:data:`WAIT_SECONDS`) for ``READY_FILE`` (the head listed ALIVE), runs the command as its child passing
SIGTERM/SIGINT on, stops it once the head process is gone (SIGKILL after :data:`HEAD_GONE_GRACE`), and
starts it again (at most twice) when it fails within :data:`STARTUP_SECONDS`. It exits with the
command's status (1, naming what it waited for, when no head appeared).
"""
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import List, Optional, Tuple

LOOPBACK = ("127.0.0.1", "::1", "localhost")
REFUSED = 3
WAIT_SECONDS = 180.0
STARTUP_SECONDS = 60.0
ATTEMPTS = 3
POLL_SECONDS = 0.02
"""How often the file is looked for: a stat, cheap beside a head start of seconds; a coarser step would
add up to itself to every worker's start."""
_PR_SET_PDEATHSIG = 1
HEAD_POLL_SECONDS = 0.1
"""How often the head process is looked for (a read of /proc/PID/stat)."""
HEAD_GONE_GRACE = 5.0
"""Seconds the node gets after SIGTERM, once its head is gone, before SIGKILL."""


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def head_running(head: Optional[Tuple[int, int]]) -> bool:
    """Whether process ``head`` (pid, start time in clock ticks since boot) still runs (not a zombie); True
    for ``None`` (no head to watch)."""
    if head is None:
        return True
    pid, start = head
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    # After the command name: [0] the state, [19] the start time.
    return len(fields) > 19 and fields[0] not in (b"Z", b"X") and int(fields[19]) == start


def _kill_node(child: "subprocess.Popen[bytes]") -> None:
    """SIGKILL the node: every other process of this process's group where this process leads it, as
    ``procs.spawn_detached`` makes it (``ray start``, its raylet, agents and workers), else ``child`` alone."""
    group, me = os.getpgrp(), os.getpid()
    if group != me:
        child.kill()
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry)) == group:
                    os.kill(int(entry), signal.SIGKILL)


def _run(command: List[str], head: Optional[Tuple[int, int]] = None) -> Tuple[int, bool]:
    """Run ``command`` to its end, passing SIGTERM/SIGINT on and stopping it once ``head`` is gone: its exit
    status, and whether it was asked to stop (or its head went)."""
    child = subprocess.Popen(command, preexec_fn=_die_with_parent)
    stopping: List[int] = []

    def forward(signum: int, frame: object) -> None:
        stopping.append(signum)
        child.send_signal(signum)

    def watch() -> None:
        while child.poll() is None:
            if not head_running(head):
                print(f"ray_node: the Ray head (pid {head[0]}) is gone; stopping this node with it",
                      file=sys.stderr, flush=True)
                stopping.append(signal.SIGTERM)
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(HEAD_GONE_GRACE)
                except subprocess.TimeoutExpired:
                    _kill_node(child)
                return
            time.sleep(HEAD_POLL_SECONDS)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    if head is not None:
        threading.Thread(target=watch, daemon=True).start()
    return child.wait(), bool(stopping)


def start_node(argv: List[str]) -> int:
    """Run ``ray`` with ``argv`` (``start ...``) held to loopback; :data:`REFUSED` when Ray cannot be."""
    try:
        from ray._private import ray_constants, services
        from ray.scripts.scripts import main as ray_main
    except ImportError as exc:
        print(f"ray_node: cannot import Ray's command line ({exc})", file=sys.stderr)
        return REFUSED
    resolve = getattr(services, "resolve_ip_for_localhost", None)
    if resolve is None or not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        print(
            "ray_node: refusing to start a Ray node: this Ray version has no "
            "ray._private.services.resolve_ip_for_localhost or ray_constants.ENABLE_RAY_CLUSTER, "
            "so its node cannot be held to 127.0.0.1 and would listen on the network",
            file=sys.stderr,
        )
        return REFUSED

    def keep_loopback(host: str) -> str:
        return host if host in LOOPBACK else resolve(host)

    services.resolve_ip_for_localhost = keep_loopback
    ray_constants.ENABLE_RAY_CLUSTER = True
    sys.argv = ["ray", *argv]
    return int(ray_main() or 0)


def main(argv: List[str]) -> int:
    """Wait for the head (until the file ``argv[0]`` exists), then run the command after ``--`` as described above."""
    if argv[:1] == ["start"]:
        return start_node(argv)
    head: Optional[Tuple[int, int]] = None
    if len(argv) > 2 and argv[1] == "--head":
        try:
            pid, start = (int(part) for part in argv[2].split(":"))
        except ValueError:
            pid = start = -1
        head, argv = (pid, start), [argv[0], *argv[3:]]
    if len(argv) < 3 or argv[1] != "--" or (head is not None and min(head) < 0):
        print("usage: ray_node.py start ... | READY_FILE [--head PID:START] -- COMMAND...", file=sys.stderr)
        return 2
    ready_file, command = argv[0], argv[2:]
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        if not head_running(head):
            print(f"the Ray head (pid {head[0]}) is gone: this node does not start", file=sys.stderr)
            return 1
        if os.path.exists(ready_file):
            break
        if time.monotonic() >= deadline:
            print(f"the Ray head was not ready ({ready_file} absent) after {WAIT_SECONDS:.0f}s", file=sys.stderr)
            return 1
        time.sleep(POLL_SECONDS)
    for attempt in range(1, ATTEMPTS + 1):
        began = time.monotonic()
        code, stopped = _run(command, head)
        if not head_running(head):
            return 1
        if stopped:
            return 0
        ran = time.monotonic() - began
        if code <= 0 or ran > STARTUP_SECONDS or attempt == ATTEMPTS:
            break
        print(
            f"ray_node: the node failed {ran:.0f}s after starting (exit status {code}); "
            f"starting it again (attempt {attempt + 1} of {ATTEMPTS})",
            file=sys.stderr, flush=True,
        )
    # A child killed by a signal reports -N; a shell reports that as 128+N.
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
