"""``python .../ray_node.py READY_FILE [--head PID:START] -- ray start ...``: one local Ray worker node, started
robustly, that ends with its head.

The supervisor records this process as the worker. It

* waits (up to :data:`WAIT_SECONDS`) until ``READY_FILE`` exists: the
  cluster's readiness check writes it in the cluster's private folder once
  the dashboard lists the head node ALIVE (a worker starts together with
  its head, and ``ray start --address`` gives up on a GCS that is not
  listening yet, or that does not know its head node yet). It asks no
  server: a port it would poll could be another user's, and the token would
  go with the question;
* runs the command as its child and passes SIGTERM/SIGINT on to it (SIGTERM
  is how Ray drains a node); the child gets SIGTERM too if this process
  dies, so a killed worker takes its node down with it;
* stops the node (SIGTERM, then SIGKILL after :data:`HEAD_GONE_GRACE`)
  once the head process ``PID`` (started at ``START``, clock ticks since
  boot as ``/proc/PID/stat`` has them) is gone: a Ray worker node outlives
  a crashed head by a minute, calling its GCS port all the while (the
  cluster's TLS keeps its calls from anyone who takes that port, and this
  ends them); a repair starts every worker again anyway;
* starts the command again (at most twice) when it fails within
  :data:`STARTUP_SECONDS`: ``ray start`` gives its raylet a fixed 30 s to
  register with the GCS, which a loaded machine can miss. A node that never
  registered is safe to start again.

It exits with the command's status (1, naming what it waited for, when no
head appeared). Run as a script, not with ``-m``: importing the plugin
package would only slow each start.
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


def main(argv: List[str]) -> int:
    """Wait for the head (until the file ``argv[0]`` exists), then run the command after ``--`` as described above."""
    head: Optional[Tuple[int, int]] = None
    if len(argv) > 2 and argv[1] == "--head":
        try:
            pid, start = (int(part) for part in argv[2].split(":"))
        except ValueError:
            pid = start = -1
        head, argv = (pid, start), [argv[0], *argv[3:]]
    if len(argv) < 3 or argv[1] != "--" or (head is not None and min(head) < 0):
        print("usage: ray_node.py READY_FILE [--head PID:START] -- COMMAND...", file=sys.stderr)
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
