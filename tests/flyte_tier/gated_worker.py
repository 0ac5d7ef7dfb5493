"""A Dask worker preload that holds every new worker back until the test opens its gate (a file appears).

With ``DASK_DISTRIBUTED__WORKER__PRELOAD`` naming this file and ``DDLSCALE_TEST_WORKER_GATE`` a path, a local
Dask worker registers with its scheduler only once that path exists (at most :data:`LIMIT` s later: then it
registers anyway, so nothing hangs): a scaling node stays RUNNING for as long as the test needs.
"""
import os
import time

LIMIT = 120.0


def dask_setup(worker) -> None:
    gate = os.environ.get("DDLSCALE_TEST_WORKER_GATE")
    end = time.monotonic() + LIMIT
    while gate and not os.path.exists(gate) and time.monotonic() < end:
        time.sleep(0.1)
