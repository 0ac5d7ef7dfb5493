"""A flow for the flyte tier: scale a local Dask cluster up (a connector node that waits for its workers), then down.

With tests/flyte_tier/gated_worker.py as the workers' preload, ``gated_up`` stays RUNNING until the test opens the gate.
"""
from flytekit import workflow

from flytekitplugins_ddlscale import ScaleCluster

CLUSTER = "dask/gated"

gated_up = ScaleCluster("gated_up", cluster=CLUSTER, replicas=2, timeout=120)
gated_down = ScaleCluster("gated_down", cluster=CLUSTER, replicas=0, timeout=120)


@workflow
def gated() -> None:
    up = gated_up()
    down = gated_down()
    up >> down
