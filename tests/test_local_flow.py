"""A Flyte workflow, run by flytekit's local executor, scaling and using a local Dask cluster.

Nothing is configured but a state directory, so ``get_backend()`` picks the
local backend; the tasks share the cluster through that directory, and user
code connects through the Domino connection variables.
"""
import os

import pytest
from flytekit import task, workflow

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends import get_backend
from tests.test_local_support import local_state, processes_mentioning  # noqa: F401

pytestmark = pytest.mark.slow


@task
def grow(name: str, workers: int) -> int:
    return get_backend().scale(ClusterRef("dask", name), workers, "Medium", timeout=120).final.ready_workers


@task
def total(name: str, upto: int) -> int:
    from distributed import Client

    with get_backend().connected(ClusterRef("dask", name)):
        address = f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}"
        with Client(address, timeout=10) as client:
            return sum(client.gather(client.map(lambda x: x + 1, range(upto))))


@task
def failing_phase(name: str, workers: int) -> int:
    backend = get_backend()
    ref = ClusterRef("dask", name)
    try:
        ready = backend.scale(ref, workers, timeout=120).final.ready_workers
        if ready == workers:
            raise RuntimeError("the phase's own work failed")
    finally:
        backend.restore_baseline(ref)
    return ready


@task
def restore(name: str) -> str:
    return get_backend().restore_baseline(ClusterRef("dask", name)).final.status


@workflow
def scaled_flow(name: str, workers: int, upto: int) -> str:
    ready = grow(name=name, workers=workers)
    result = total(name=name, upto=upto)
    ready >> result
    done = restore(name=name)
    result >> done
    return done


@workflow
def failing_flow(name: str, workers: int) -> int:
    return failing_phase(name=name, workers=workers)


@task
def noop() -> int:
    return 0


@pytest.fixture(scope="module", autouse=True)
def flytekit_loop_thread():
    """Start flytekit's own long-lived loop thread before the per-test thread snapshot."""
    noop()


@pytest.fixture
def nothing_configured(local_state, monkeypatch):
    for var in ("DDLSCALE_BACKEND", "CLUSTER_SCALER_BASE_URL", "DOMINO_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(local_state.parent))
    return local_state.parent / "local"


def test_flow_scales_computes_and_leaves_nothing_running(nothing_configured):
    assert scaled_flow(name="flow", workers=2, upto=50) == "Stopped"
    assert processes_mentioning(str(nothing_configured)) == []


def test_flow_that_fails_leaves_nothing_running(nothing_configured):
    with pytest.raises(Exception, match="the phase's own work failed"):
        failing_flow(name="broken", workers=1)
    assert processes_mentioning(str(nothing_configured)) == []
