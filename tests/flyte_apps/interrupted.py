"""A node-based flow that is interrupted (Ctrl-C) while its cluster is scaled up."""
import time

from flytekit import task, workflow

from flytekitplugins_ddlscale import ScaleCluster, ScaleOutcome

scale_up = ScaleCluster("scale_up", cluster="dask/interrupt-test", replicas=1, timeout=120)
scale_down = ScaleCluster("scale_down", cluster="dask/interrupt-test", replicas=0, timeout=120)


@task
def long_stage(up: ScaleOutcome) -> int:
    """Stands for long work; the test interrupts it."""
    time.sleep(120)
    return up.effective


@workflow
def flow() -> int:
    """``scale_up >> long_stage >> scale_down``."""
    up = scale_up()
    out = long_stage(up=up)
    out >> scale_down()
    return out
