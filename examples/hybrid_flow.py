"""A hybrid flow: single-node preparation, distributed Dask work on a scaled cluster, scale-down.

Quick start (no cluster configured: the local backend starts a real local
Dask cluster and takes it down again at the end)::

    pyflyte run examples/hybrid_flow.py hybrid_flow
    pyflyte run examples/hybrid_flow.py hybrid_flow --n 200000 --workers 3

Shown here:

* ``ScaleCluster(wait=False)`` requests the workers while ``prepare`` runs,
  and ``WaitForCluster`` waits only right before the distributed stage
  (pre-warming);
* ``sum_of_squares`` runs real Dask work, connecting through the
  ``DASK_SCHEDULER_SERVICE_HOST``/``_PORT`` variables Domino injects (set
  locally by ``connected``);
* ``scale_down`` returns the cluster to no workers, and ``cleanup`` does
  the same if any node fails;
* ``check_in_phase`` uses ``@distributed_phase`` inside one task: scale,
  work, and give back the size it found (no workers after ``scale_down``;
  for a local cluster that the flow created, that takes it down). The decorator's size is fixed when the task is
  defined, so ``--workers`` sizes the nodes but not this phase: it always
  uses ``WORKERS`` (2). For a size chosen at run time, use
  ``with cluster_phase(CLUSTER, workers): ...`` inside the task body.

On Domino, set ``DDLSCALE_EXAMPLE_CLUSTER=dask`` (a bare kind: the run's
own cluster) and the scaler or kubernetes backend is chosen automatically.
"""
import os
import time
from typing import List

from flytekit import kwtypes, task, workflow
from flytekit.deck import DeckField

from flytekitplugins_ddlscale import (
    ClusterReady,
    ScaleCluster,
    WaitForCluster,
    connected,
    distributed_phase,
    scale_down_on_failure,
)

CLUSTER = os.environ.get("DDLSCALE_EXAMPLE_CLUSTER", "dask/hybrid-demo")
WORKERS = 2
TIMEOUT = 300.0

scale_and_wait = ScaleCluster("scale_and_wait", cluster=CLUSTER, replicas=WORKERS, timeout=TIMEOUT)
request_workers = ScaleCluster("request_workers", cluster=CLUSTER, replicas=WORKERS, wait=False, timeout=TIMEOUT)
workers_ready = WaitForCluster("workers_ready", cluster=CLUSTER, timeout=TIMEOUT)
scale_down = ScaleCluster("scale_down", cluster=CLUSTER, replicas=0, timeout=TIMEOUT)
cleanup = scale_down_on_failure("cleanup", cluster=CLUSTER, inputs=kwtypes(n=int, workers=int))


def _dask_client():
    from distributed import Client

    host = os.environ["DASK_SCHEDULER_SERVICE_HOST"]
    port = os.environ["DASK_SCHEDULER_SERVICE_PORT"]
    return Client(f"{host}:{port}", timeout=60, set_as_default=False)


@task
def prepare(n: int) -> List[int]:
    """Single-node work: build the input (a pause stands in for loading and cleaning data)."""
    time.sleep(float(os.environ.get("DDLSCALE_EXAMPLE_PREPARE_SECONDS", "3")))
    return list(range(n))


@task(enable_deck=True, deck_fields=(DeckField.INPUT, DeckField.OUTPUT))
def sum_of_squares(data: List[int], ready: ClusterReady) -> int:
    """Distributed work on the cluster's workers."""
    with connected(ready.cluster):
        with _dask_client() as client:
            chunks = [data[i::ready.workers] for i in range(ready.workers)]
            futures = client.map(lambda chunk: sum(x * x for x in chunk), chunks)
            return sum(client.gather(futures))


@task(enable_deck=True, deck_fields=(DeckField.INPUT, DeckField.OUTPUT))
# Fixed at definition: the workflow's `workers` input does not reach this phase (see the module docstring).
@distributed_phase(cluster=CLUSTER, replicas=WORKERS, timeout=TIMEOUT, sample_interval=0.5)
def check_in_phase(data: List[int], expected: int) -> bool:
    """The same computation inside ``@distributed_phase``: scaled for the body, restored after it."""
    with _dask_client() as client:
        total = client.submit(lambda xs: sum(x * x for x in xs), data).result()
    if total != expected:
        raise ValueError(f"distributed result {total} != {expected}")
    return True


def _compute_then_check(data, ready):  # type: ignore[no-untyped-def]
    """The distributed stage, shared by both workflows (called while a workflow body compiles)."""
    total = sum_of_squares(data=data, ready=ready)
    down = scale_down()
    total >> down
    checked = check_in_phase(data=data, expected=total)
    down >> checked
    return checked


@workflow(on_failure=cleanup)
def hybrid_flow(n: int = 100000, workers: int = WORKERS) -> bool:
    """Pre-warmed: the scale is requested before ``prepare`` and awaited only after it."""
    pending = request_workers(replicas=workers)
    data = prepare(n=n)
    pending >> data
    ready = workers_ready(replicas=pending.effective)
    data >> ready
    return _compute_then_check(data, ready)


@workflow(on_failure=cleanup)
def sequential_flow(n: int = 100000, workers: int = WORKERS) -> bool:
    """For comparison: scale and wait first, then prepare (the time pre-warming saves)."""
    up = scale_and_wait(replicas=workers)
    data = prepare(n=n)
    up >> data
    ready = workers_ready(replicas=up.effective)
    data >> ready
    return _compute_then_check(data, ready)
