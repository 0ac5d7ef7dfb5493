"""Flyte tasks the overhead benchmark runs in local execution.

Module-level, as flytekit expects of tasks. They address ``ray/ray-bench``
through the scaler backend, which the benchmark points at its test server
with ``$CLUSTER_SCALER_BASE_URL``.
"""
from flytekit import task

from flytekitplugins_ddlscale.phase import distributed_phase
from flytekitplugins_ddlscale.tasks import ScaleCluster

CLUSTER = "ray/ray-bench"
REPLICAS = 2

scale_node = ScaleCluster("bench_scale_node", cluster=CLUSTER, replicas=REPLICAS, backend="scaler", timeout=60)


@task
def plain_task(x: int) -> int:
    """The body alone: the reference for the phase's overhead."""
    return x + 1


@task
@distributed_phase(cluster=CLUSTER, replicas=REPLICAS, backend="scaler", timeout=60)
def phased_task(x: int) -> int:
    """The same body inside ``@distributed_phase``."""
    return x + 1
