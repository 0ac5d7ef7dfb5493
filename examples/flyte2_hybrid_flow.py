"""The Flyte 2 counterpart of ``examples/hybrid_flow.py`` (its ``hybrid_flow``), step for step.

Run it locally (the ``flyte2`` extra)::

    python examples/flyte2_hybrid_flow.py            # n=100000, 2 workers
    python examples/flyte2_hybrid_flow.py 200000 3

What changed from the flytekit flow, and nothing else:

* nodes are defined with ``env=`` (the ``flyte.TaskEnvironment`` they belong
  to) and awaited by a parent task instead of wired in a ``@workflow``;
  ordering is the order of the awaits, so no ``>>``;
* ``@workflow(on_failure=cleanup)`` becomes ``try/except`` around the
  steps, awaiting a ``RestoreCluster`` node on failure (the flytekit
  ``cleanup`` restores the baseline too);
* ``@task(enable_deck=True)`` becomes ``@env.task(report=True)``: the phase's
  worker plot is a Report tab.

The summary lines are the same, node for node.
"""
import os
import sys
import time
from typing import List

import flyte

from flytekitplugins_ddlscale.flyte2 import (
    ClusterReady,
    RestoreCluster,
    ScaleCluster,
    WaitForCluster,
    connected,
    distributed_phase,
)

CLUSTER = os.environ.get("DDLSCALE_EXAMPLE_CLUSTER", "dask/hybrid-demo")
WORKERS = 2
TIMEOUT = 300.0

env = flyte.TaskEnvironment("flyte2_hybrid_flow")
request_workers = ScaleCluster("request_workers", env=env, cluster=CLUSTER, replicas=WORKERS, wait=False,
                               timeout=TIMEOUT)
workers_ready = WaitForCluster("workers_ready", env=env, cluster=CLUSTER, timeout=TIMEOUT)
scale_down = ScaleCluster("scale_down", env=env, cluster=CLUSTER, replicas=0, timeout=TIMEOUT)
cleanup = RestoreCluster("cleanup", env=env, cluster=CLUSTER, timeout=TIMEOUT)


def _dask_client():
    from distributed import Client

    host = os.environ["DASK_SCHEDULER_SERVICE_HOST"]
    port = os.environ["DASK_SCHEDULER_SERVICE_PORT"]
    return Client(f"{host}:{port}", timeout=60, set_as_default=False)


@env.task
def prepare(n: int) -> List[int]:
    """Single-node work: build the input (a pause stands in for loading and cleaning data)."""
    time.sleep(float(os.environ.get("DDLSCALE_EXAMPLE_PREPARE_SECONDS", "3")))
    return list(range(n))


@env.task
def sum_of_squares(data: List[int], ready: ClusterReady) -> int:
    """Distributed work on the cluster's workers."""
    with connected(ready.cluster):
        with _dask_client() as client:
            chunks = [data[i::ready.workers] for i in range(ready.workers)]
            futures = client.map(lambda chunk: sum(x * x for x in chunk), chunks)
            return sum(client.gather(futures))


@env.task(report=True)
@distributed_phase(cluster=CLUSTER, replicas=WORKERS, timeout=TIMEOUT, sample_interval=0.5)
def check_in_phase(data: List[int], expected: int) -> bool:
    """The same computation inside ``distributed_phase``: scaled for the body, restored after it."""
    with _dask_client() as client:
        total = client.submit(lambda xs: sum(x * x for x in xs), data).result()
    if total != expected:
        raise ValueError(f"distributed result {total} != {expected}")
    return True


@env.task
async def hybrid_flow(n: int = 100000, workers: int = WORKERS) -> bool:
    """Pre-warmed: the scale is requested before ``prepare`` and awaited only after it."""
    try:
        pending = await request_workers(replicas=workers)
        data = await prepare.aio(n)
        ready = await workers_ready(replicas=pending.effective)
        total = await sum_of_squares.aio(data, ready)
        await scale_down()
        return await check_in_phase.aio(data, total)
    except Exception:
        await cleanup()  # what `on_failure=cleanup` does: only when a step failed
        raise


if __name__ == "__main__":
    sizes = [int(arg) for arg in sys.argv[1:3]]
    flyte.init()  # the nodes run through flyte's local connector runner, which needs it
    run = flyte.with_runcontext(mode="local").run(hybrid_flow, *sizes)
    print(run.outputs()[0])
