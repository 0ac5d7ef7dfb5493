"""``python .../ray_node.py READY_FILE -- ray start ...``: one local Ray worker node, started robustly.

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
* starts the command again (at most twice) when it fails within
  :data:`STARTUP_SECONDS`: ``ray start`` gives its raylet a fixed 30 s to
  register with the GCS, which a loaded machine can miss. A node that never
  registered is safe to start again.

It exits with the command's status (1, naming what it waited for, when no
head appeared). Run as a script, not with ``-m``: importing the plugin
package would only slow each start.
"""
import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import List, Tuple

WAIT_SECONDS = 180.0
STARTUP_SECONDS = 60.0
ATTEMPTS = 3
POLL_SECONDS = 0.02
"""How often the file is looked for: a stat, cheap beside a head start of seconds; a coarser step would
add up to itself to every worker's start."""
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _run(command: List[str]) -> Tuple[int, bool]:
    """Run ``command`` to its end, passing SIGTERM/SIGINT on: its exit status, and whether it was
    asked to stop."""
    child = subprocess.Popen(command, preexec_fn=_die_with_parent)
    stopping: List[int] = []

    def forward(signum: int, frame: object) -> None:
        stopping.append(signum)
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return child.wait(), bool(stopping)


def main(argv: List[str]) -> int:
    """Wait for the head (until the file ``argv[0]`` exists), then run the command after ``--`` as described above."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: ray_node.py READY_FILE -- COMMAND...", file=sys.stderr)
        return 2
    ready_file, command = argv[0], argv[2:]
    deadline = time.monotonic() + WAIT_SECONDS
    while not os.path.exists(ready_file):
        if time.monotonic() >= deadline:
            print(f"the Ray head was not ready ({ready_file} absent) after {WAIT_SECONDS:.0f}s", file=sys.stderr)
            return 1
        time.sleep(POLL_SECONDS)
    for attempt in range(1, ATTEMPTS + 1):
        began = time.monotonic()
        code, stopped = _run(command)
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
