"""A Dask worker preload that holds every new worker back until the test opens its gate (a file appears).

With ``DASK_DISTRIBUTED__WORKER__PRELOAD`` naming this file and ``DASK_DDLSCALE_TEST_WORKER_GATE`` a path (a
``DASK_`` name: a local cluster's processes inherit only such, docs/local.md), a local Dask worker registers with its scheduler only once that path exists (at most :data:`LIMIT` s later: then it
registers anyway, so nothing hangs): a scaling node stays RUNNING for as long as the test needs. Each worker
appends the moment it goes on (``time.time()``) to ``<gate>.released``: its Ready moment, but for the few
milliseconds its registration takes.
"""
import os
import time

LIMIT = 120.0


def dask_setup(worker) -> None:
    gate = os.environ.get("DASK_DDLSCALE_TEST_WORKER_GATE")
    if not gate:
        return
    end = time.monotonic() + LIMIT
    while not os.path.exists(gate) and time.monotonic() < end:
        time.sleep(0.05)
    with open(f"{gate}.released", "a") as released:
        released.write(f"{time.time()}\n")


def released(gate: str) -> list:
    """The moments the workers held by ``gate`` went on, in order."""
    try:
        with open(f"{gate}.released") as found:
            return sorted(float(line) for line in found if line.strip())
    except FileNotFoundError:
        return []
