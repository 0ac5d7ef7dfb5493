"""Start a Spark worker once its master answers: ``python -m ...spark_launch URL SECONDS -- ARGV...``.

A standalone worker tries to register at once and then only every 5 to 15
seconds, so a worker started together with its master would join long after
the master is up. This waits, at most ``SECONDS``, until the master's web UI
at ``URL`` reports it ALIVE, then replaces itself with ``ARGV`` (``exec``: the
pid the supervisor recorded becomes the worker's). Past ``SECONDS`` it starts
the worker anyway and leaves the rest to the worker's own retries and to the
caller's wait.
"""
import os
import sys
import time
from typing import List

from ._spark_ops import master_json

_POLL = 0.1


def main(argv: List[str]) -> None:
    """Wait for the master named by ``argv``, then exec the worker command after ``--``."""
    url, seconds, separator, *command = argv
    if separator != "--" or not command:
        raise SystemExit("usage: spark_launch URL SECONDS -- COMMAND...")
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        status = master_json(url, timeout=1.0)
        if status is not None and status.get("status") == "ALIVE":
            break
        time.sleep(_POLL)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
