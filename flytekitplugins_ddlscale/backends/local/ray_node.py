"""``python .../ray_node.py HOST:PORT -- ray start ...``: wait for a Ray head, then become the node.

A local Ray worker is started together with its head, but ``ray start
--address`` gives up on a GCS that is not listening yet. This waits (up to
``WAIT_SECONDS``) until the GCS port accepts connections, then replaces
itself with the ``ray start`` command, so the pid the supervisor recorded is
the node's. Without a head by then it exits with status 1, naming what it
waited for.
"""
import os
import socket
import sys
import time
from typing import List

WAIT_SECONDS = 120.0


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def main(argv: List[str]) -> int:
    """Wait for ``argv[0]`` (``host:port``), then exec the command after ``--``."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: ray_node.py HOST:PORT -- COMMAND...", file=sys.stderr)
        return 2
    address, command = argv[0], argv[2:]
    deadline = time.monotonic() + WAIT_SECONDS
    while not _listening(address):
        if time.monotonic() >= deadline:
            print(f"no Ray head (GCS) listening at {address} after {WAIT_SECONDS:.0f}s", file=sys.stderr)
            return 1
        time.sleep(0.2)
    sys.stdout.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
