"""Flyte 2 flows using the scaling nodes and distributed_phase, as a user would write them."""
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import List

import flyte

from flytekitplugins_ddlscale.flyte2 import (
    ClusterReady,
    RestartHead,
    RestartOutcome,
    RestoreCluster,
    RestoreOutcome,
    ScaleCluster,
    ScaleOutcome,
    WaitForCluster,
    distributed_phase,
)

CLUSTER = "dask/flyte2-test"
SLOW_CLUSTER = "dask/flyte2-slow"
"""A cluster whose new workers take long to come up (the scaler test server's delay): a start stays under way."""
env = flyte.TaskEnvironment("flyte2_flows")

request = ScaleCluster("request", env=env, cluster=CLUSTER, replicas=2, wait=False, timeout=120)
ready = WaitForCluster("ready", env=env, cluster=CLUSTER, timeout=120)
restart = RestartHead("restart", env=env, cluster=CLUSTER, timeout=120)
restore = RestoreCluster("restore", env=env, cluster=CLUSTER, timeout=120)
scale_mpi = ScaleCluster("scale_mpi", env=env, cluster="mpi/flyte2-test", replicas=1, timeout=30)
left_up = ScaleCluster("left_up", env=env, cluster=CLUSTER, replicas=1, timeout=120)
scale_head = ScaleCluster("scale_head", env=env, cluster=CLUSTER, replicas=1, head_hw_tier="Large", timeout=30)


def dask_workers() -> int:
    """Workers the Dask scheduler named by Domino's variables has (a blocking client)."""
    from distributed import Client

    address = f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}"
    with Client(address, timeout=30, set_as_default=False) as client:
        return len(client.nthreads())


@env.task
async def all_nodes(replicas: int) -> List[str]:
    """Every node once: request, wait, restart the head, restore; their outcomes' types and key fields."""
    pending = await request(replicas=replicas)
    up = await ready(replicas=pending.effective)
    head = await restart()
    back = await restore()
    assert isinstance(pending, ScaleOutcome) and isinstance(up, ClusterReady)
    assert isinstance(head, RestartOutcome) and isinstance(back, RestoreOutcome)
    return [
        f"{pending.previous_workers}->{pending.effective} waited={pending.waited}",
        f"ready={up.ready_workers} {up.readiness}",
        f"head ready={head.ready}",
        f"{back.previous_workers}->{back.workers} {back.restored}",
    ]


@env.task
async def unsupported_kind() -> int:
    """A node the local backend refuses (it serves no MPI clusters)."""
    return (await scale_mpi()).effective


@env.task
async def scale_with_head_tier() -> int:
    """A scale node that also asks for a head tier, which the connector leaves to RestartHead."""
    return (await scale_head()).effective


@env.task(report=True)
@distributed_phase(cluster=CLUSTER, replicas=2, timeout=120, sample_interval=0.2)
def sync_phase(fail: bool) -> int:
    """A sync body: the workers it sees through Domino's variables (or a failure)."""
    workers = dask_workers()
    if fail:
        raise ValueError(f"failed on purpose with {workers} workers")
    return workers


@env.task(report=True)
@distributed_phase(cluster=CLUSTER, replicas=2, timeout=120, sample_interval=0.2)
async def async_phase(fail: bool) -> int:
    """An async body: the same, with the blocking client in a thread."""
    workers = await asyncio.to_thread(dask_workers)
    if fail:
        raise ValueError(f"failed on purpose with {workers} workers")
    return workers


@env.task
async def both_phases(fail: bool) -> List[int]:
    """The sync phase, then the async one, from an async parent."""
    return [await sync_phase.aio(fail), await async_phase(fail)]


@env.task
@distributed_phase(cluster=CLUSTER, replicas=2, timeout=120, sample_interval=0.2)
def sync_interrupted(marker: str) -> int:
    """Tells the test it runs, then blocks in C code (a long sleep) until the test sends a signal."""
    Path(marker).write_text(str(dask_workers()))
    time.sleep(120)
    return 0


@env.task
@distributed_phase(cluster=CLUSTER, replicas=2, timeout=120, sample_interval=0.2)
async def async_interrupted(marker: str) -> int:
    """The same as an async body, waiting on the event loop."""
    Path(marker).write_text(str(await asyncio.to_thread(dask_workers)))
    await asyncio.sleep(120)
    return 0


@env.task
@distributed_phase(cluster=SLOW_CLUSTER, replicas=3, timeout=120, sample_interval=0.2)
def sync_interrupted_starting(marker: str) -> int:
    """A body that must not run: the test stops the phase while its workers are still coming up."""
    Path(marker).write_text("body started")
    return 0


@env.task
@distributed_phase(cluster=SLOW_CLUSTER, replicas=3, timeout=120, sample_interval=0.2)
async def async_interrupted_starting(marker: str) -> int:
    """The same as an async body."""
    Path(marker).write_text("body started")
    return 0


@env.task
async def interrupted_nodes(marker: str) -> int:
    """Scales up with a node, tells the test, then waits for the interrupt before any node scales down."""
    up = await left_up()
    Path(marker).write_text(str(up.ready_workers))
    await asyncio.sleep(120)
    return up.ready_workers


if __name__ == "__main__":
    # python -m tests.flyte_apps.flyte2_flows TASK MARKER: one of the tasks the test interrupts.
    task = {
        "sync_interrupted": sync_interrupted,
        "async_interrupted": async_interrupted,
        "sync_interrupted_starting": sync_interrupted_starting,
        "async_interrupted_starting": async_interrupted_starting,
        "interrupted_nodes": interrupted_nodes,
    }[sys.argv[1]]
    flyte.init()  # the nodes run through flyte's local connector runner, which needs it
    flyte.with_runcontext(mode="local").run(task, marker=sys.argv[2])
