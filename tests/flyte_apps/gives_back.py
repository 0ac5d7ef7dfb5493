"""The flow of docs/guide.md's "a phase between nodes gives back what it found": a node scales up, a phase needs more
for one task, and a node restores what the flow found.

``ScaleCluster(replicas=1)`` records the baseline (no cluster: 0 workers) and
scales to 1; ``@distributed_phase(replicas=3)`` holds at least 3 for its body
and gives back the 1 worker it found; ``RestoreCluster`` then restores the
baseline, taking the cluster the flow created down. On the local backend.
"""
import os
import typing

from flytekit import task, workflow

from flytekitplugins_ddlscale import RestoreCluster, RestoreOutcome, ScaleCluster, distributed_phase
from flytekitplugins_ddlscale.backends import get_backend
from flytekitplugins_ddlscale.refs import ClusterRef
from flytekitplugins_ddlscale.tasks import ScaleOutcome

CLUSTER = "dask/gives-back"

scale_to_one = ScaleCluster("scale_to_one", cluster=CLUSTER, replicas=1, timeout=120)
restore_found = RestoreCluster("restore_found", cluster=CLUSTER, timeout=120)


@task
@distributed_phase(cluster=CLUSTER, replicas=3, timeout=120, deck=False)
def train(up: ScaleOutcome) -> int:
    """The workers the body sees, through the connection variables the phase exports."""
    from distributed import Client

    address = f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}"
    with Client(address, timeout=30, set_as_default=False) as client:
        return len(client.scheduler_info()["workers"])


@task
def workers_after(seen: int) -> int:
    """The cluster's size once the phase has ended."""
    return get_backend().get_state(ClusterRef.parse(CLUSTER)).desired_workers


@workflow
def node_phase_node() -> typing.Tuple[int, int, RestoreOutcome]:
    """``ScaleCluster(1) >> phase(3) >> RestoreCluster``."""
    up = scale_to_one()
    seen = train(up=up)
    after = workers_after(seen=seen)
    done = restore_found()
    after >> done
    return seen, after, done
