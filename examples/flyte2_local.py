"""A Flyte 2 flow that scales a Dask cluster: pre-warm node, phase-wrapped task, restore node.

Run it locally (the `flyte2` extra; no cluster configured: the local backend
starts a real local Dask cluster and the restore takes it down again)::

    python examples/flyte2_local.py

Shown here:

* ``prewarm`` (a ``ScaleCluster`` node with ``wait=False``) requests the
  workers while ``prepare`` runs;
* ``check_workers`` is wrapped in ``distributed_phase``: before its body the
  cluster holds at least ``WORKERS`` workers, registered with the Dask
  scheduler, and the body reaches it through the
  ``DASK_SCHEDULER_SERVICE_HOST``/``_PORT`` variables Domino injects (set
  locally by the phase); after it, the phase gives back the size it found
  (the pre-warmed one), and its timeline and worker-seconds are a tab of the
  task's Report;
* ``restore`` (a ``RestoreCluster`` node) puts the cluster back to its
  recorded baseline, also when a step failed: the cluster did
  not exist before ``prewarm``, so it is taken down.

On Domino, set ``DDLSCALE_EXAMPLE_CLUSTER=dask`` (a bare kind: the run's own
cluster) and the scaler or kubernetes backend is chosen automatically.
"""
import os
import time
from typing import List

import flyte

from flytekitplugins_ddlscale.flyte2 import RestoreCluster, ScaleCluster, distributed_phase

CLUSTER = os.environ.get("DDLSCALE_EXAMPLE_CLUSTER", "dask/flyte2-demo")
WORKERS = 2
TIMEOUT = 300.0

env = flyte.TaskEnvironment("flyte2_local")
prewarm = ScaleCluster("prewarm", env=env, cluster=CLUSTER, replicas=WORKERS, wait=False, timeout=TIMEOUT)
restore = RestoreCluster("restore", env=env, cluster=CLUSTER, timeout=TIMEOUT)


@env.task
def prepare(n: int) -> List[int]:
    """Single-node work while the workers start (a pause stands in for loading data)."""
    time.sleep(float(os.environ.get("DDLSCALE_EXAMPLE_PREPARE_SECONDS", "3")))
    return list(range(n))


@env.task(report=True)
@distributed_phase(cluster=CLUSTER, replicas=WORKERS, timeout=TIMEOUT, sample_interval=0.5)
async def check_workers(data: List[int]) -> int:
    """Distributed work that first checks it really has ``WORKERS`` Dask workers."""
    from distributed import Client

    address = f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}"
    async with Client(address, asynchronous=True, timeout=60, set_as_default=False) as client:
        workers = len(await client.nthreads())
        if workers != WORKERS:
            raise RuntimeError(f"the phase promised {WORKERS} Dask workers, the scheduler has {workers}")
        chunks = [data[i::WORKERS] for i in range(WORKERS)]
        return sum(await client.gather(client.map(lambda chunk: sum(x * x for x in chunk), chunks)))


@env.task
async def flow(n: int = 1000) -> int:
    """Pre-warm, prepare, work in the phase, restore (also after a failure)."""
    try:
        await prewarm()
        data = await prepare.aio(n)
        total = await check_workers(data)
    except Exception:
        await restore()
        raise
    await restore()
    return total


if __name__ == "__main__":
    flyte.init()  # the nodes run through flyte's local connector runner, which needs it
    run = flyte.with_runcontext(mode="local").run(flow)
    print(run.outputs()[0])
