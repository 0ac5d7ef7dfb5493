"""Head restart through the scaler service: Ray works, Spark/Dask hit the service's head-name defect."""
import pytest

from flytekitplugins_ddlscale import (
    BackendUnavailableError,
    ClusterNotFoundError,
    ClusterRef,
    ScalingTimeoutError,
    UnsupportedOperationError,
)

RAY = ClusterRef("ray", "ray-run1")


@pytest.fixture
def slow_head(scaler_server):
    scaler_server.head_recreate_delay = 0.3
    scaler_server.head_ready_delay = 0.3
    scaler_server.add_cluster("ray", "ray-run1", replicas=2)
    return scaler_server


def test_ray_restart_waits_until_restarted_and_ready(slow_head, scaler_backend):
    seen = []
    result = scaler_backend.restart_head(RAY, timeout=10, progress=seen.append)
    assert result.pod == "ray-run1-ray-head-0" and result.ready and result.waited
    restart = [r for r in slow_head.requests if "/restart_head/" in r.path]
    assert len(restart) == 1 and restart[0].query == {} and restart[0].body is None
    polls = [r for r in slow_head.requests if "/restart_head_status/" in r.path]
    assert {p.query["started_at"][0] for p in polls} == {result.started_at}
    assert [s.detail for s in seen][0].startswith("head_pod_not_found")
    assert seen[-1].current == 1 and result.final.status == "Running"


def test_restart_without_wait(slow_head, scaler_backend):
    result = scaler_backend.restart_head(RAY, wait=False)
    assert not result.ready and not result.waited and result.started_at.endswith("Z")
    assert slow_head.count("GET", "/restart_head_status/") == 0


def test_restart_wait_times_out_with_last_state(slow_head, scaler_backend):
    slow_head.head_ready_delay = 30
    with pytest.raises(ScalingTimeoutError) as info:
        scaler_backend.restart_head(RAY, timeout=0.8)
    assert "last restart status: restarted_but_not_ready" in str(info.value)
    assert info.value.state is not None and info.value.state.status == "Starting"


@pytest.mark.parametrize("kind", ["spark", "dask"])
def test_spark_and_dask_restart_explain_the_service_defect(scaler_server, scaler_backend, kind):
    scaler_server.add_cluster(kind, f"{kind}-run1")
    with pytest.raises(UnsupportedOperationError) as info:
        scaler_backend.restart_head(ClusterRef(kind, f"{kind}-run1"))
    message = str(info.value)
    assert f"{kind}-run1-{kind}-head-0" in message and "kubernetes backend" in message
    assert scaler_server.count("PATCH", "/restart_head/") == 1


def test_missing_ray_head_is_not_found(scaler_backend):
    with pytest.raises(ClusterNotFoundError):
        scaler_backend.restart_head(ClusterRef("ray", "ray-missing"))


def test_head_tier_is_unsupported_before_sending(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1")
    with pytest.raises(UnsupportedOperationError) as info:
        scaler_backend.restart_head(RAY, head_hw_tier="Medium")
    assert "head" in str(info.value) and "kubernetes" in str(info.value)
    assert scaler_server.requests == []


@pytest.mark.parametrize("fault", ["status", "drop"])
def test_restart_is_never_retried(slow_head, scaler_backend, fault):
    slow_head.inject_faults(fault, count=1, status=503, path="/restart_head/")
    with pytest.raises(BackendUnavailableError):
        scaler_backend.restart_head(RAY)
    assert slow_head.count("PATCH", "/restart_head/") == 1


def test_restart_status_polls_are_retried(slow_head, scaler_backend):
    slow_head.inject_faults("status", count=2, status=502, path="/restart_head_status/")
    assert scaler_backend.restart_head(RAY, timeout=10).ready
