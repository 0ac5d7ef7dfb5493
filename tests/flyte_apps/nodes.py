"""Flows built from ScaleCluster / WaitForCluster / RestartHead nodes, on the local backend's cluster."""
import os

from flytekit import kwtypes, task, workflow

from flytekitplugins_ddlscale.tasks import (
    ClusterReady,
    RestartHead,
    RestoreCluster,
    ScaleCluster,
    ScaleOutcome,
    WaitForCluster,
)
from flytekitplugins_ddlscale.workflow_helpers import connected, scale_down_on_failure

CLUSTER = "dask/nodes-test"

scale_up = ScaleCluster("scale_up", cluster=CLUSTER, replicas=2, timeout=120)
scale_down = ScaleCluster("scale_down", cluster=CLUSTER, replicas=0, timeout=120)
request = ScaleCluster("request", cluster=CLUSTER, replicas=2, wait=False, timeout=120)
ready = WaitForCluster("ready", cluster=CLUSTER, timeout=120)
restart = RestartHead("restart", cluster=CLUSTER, timeout=120)
restore = RestoreCluster("restore", cluster=CLUSTER, timeout=120)
retried = ScaleCluster("retried", cluster=CLUSTER, replicas=2, timeout=600, retries=3, interruptible=True)
cleanup = scale_down_on_failure("cleanup", cluster=CLUSTER, inputs=kwtypes(fail=bool))


@task
def count_workers(up: ScaleOutcome) -> int:
    """How many workers the Dask scheduler reports, reached through the exported variables."""
    from distributed import Client

    with connected(up.cluster):
        address = f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}"
        with Client(address, timeout=30, set_as_default=False) as client:
            return len(client.scheduler_info()["workers"])


@task
def double_on_cluster(ready: ClusterReady, x: int) -> int:
    """Real work on a worker."""
    from distributed import Client

    with connected(ready.cluster):
        address = f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}"
        with Client(address, timeout=30, set_as_default=False) as client:
            return client.submit(lambda v: v * 2, x).result()


@task
def maybe_fail(fail: bool) -> int:
    """Fails on request, to drive the failure handler."""
    if fail:
        raise RuntimeError("stage failed on purpose")
    return 1


@workflow
def up_work_down() -> int:
    """``up >> work >> down`` with a data dependency on the scale outcome."""
    up = scale_up()
    seen = count_workers(up=up)
    down = scale_down()
    seen >> down
    return seen


@workflow
def prewarmed(x: int = 21) -> int:
    """Request without waiting, wait later, then compute."""
    pending = request()
    up = ready(replicas=pending.effective)
    return double_on_cluster(ready=up, x=x)


@workflow(on_failure=cleanup)
def failing(fail: bool = True) -> int:
    """Scales up, then a stage fails: the failure handler must restore the cluster."""
    up = scale_up()
    out = maybe_fail(fail=fail)
    up >> out
    return out


@workflow
def up_work_restore() -> int:
    """``up >> work >> restore``: the flow ends at the recorded baseline without naming it."""
    up = scale_up()
    seen = count_workers(up=up)
    seen >> restore()
    return seen
