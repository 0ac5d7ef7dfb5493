"""A task using @distributed_phase, as a user would write it."""
import os
from typing import List

from flytekit import task, workflow
from flytekit.deck import DeckField

from flytekitplugins_ddlscale import distributed_phase

CLUSTER = "dask/phase-test"


@task(enable_deck=True, deck_fields=(DeckField.INPUT, DeckField.OUTPUT))
@distributed_phase(cluster=CLUSTER, replicas=2, timeout=120, sample_interval=0.2)
def total_on_cluster(values: List[int], scale: int = 1) -> int:
    """Sums on the cluster's workers, connecting the way Domino code does."""
    from distributed import Client

    address = f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}"
    with Client(address, timeout=30, set_as_default=False) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        return sum(client.gather(client.map(lambda v: v * scale, values)))


@workflow
def phase_flow(scale: int = 3) -> int:
    """One phased task in a workflow."""
    return total_on_cluster(values=[1, 2, 3], scale=scale)
