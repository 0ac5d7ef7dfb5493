"""ScalerServiceBackend against the protocol-true test server: state, scale, waits, errors."""
import pytest

from flytekitplugins_ddlscale import (
    CapacityExceededError,
    ClusterNotFoundError,
    ClusterRef,
    InvalidInputError,
    NotScalableError,
    ScalingError,
    ScalingTimeoutError,
    UnauthorizedError,
    UnknownTierError,
    UnsupportedOperationError,
)
from flytekitplugins_ddlscale.backends import ClusterBackend
from flytekitplugins_ddlscale.backends.scaler import DEFAULT_BASE_URL, ScalerClient, ScalerServiceBackend
from flytekitplugins_ddlscale.backends.scaler._client import error_from_response
from flytekitplugins_ddlscale.backends._support.domino_auth import DominoAuth
from tests.servers.scaler_server import DEFAULT_API_KEY, OTHER_API_KEY

RAY = ClusterRef("ray", "ray-run1")


def test_is_a_cluster_backend_with_honest_capabilities(scaler_backend):
    assert isinstance(scaler_backend, ClusterBackend)
    caps = scaler_backend.capabilities
    assert caps.kinds == frozenset({"ray", "spark", "dask"})
    assert not (caps.observes_readiness or caps.holds_size or caps.head_tier or caps.persistent_baseline)


def test_base_url_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTER_SCALER_BASE_URL", raising=False)
    with ScalerServiceBackend(api_key="k-1234", state_dir=tmp_path) as backend:
        assert backend.base_url == DEFAULT_BASE_URL
    monkeypatch.setenv("CLUSTER_SCALER_BASE_URL", "http://scaler.example:8080/")
    with ScalerServiceBackend(api_key="k-1234", state_dir=tmp_path) as backend:
        assert backend.base_url == "http://scaler.example:8080"
    with ScalerServiceBackend("http://arg.example", api_key="k-1234", state_dir=tmp_path) as backend:
        assert backend.base_url == "http://arg.example"


@pytest.mark.parametrize("kind,name", [("ray", "ray-run1"), ("spark", "spark-run1"), ("dask", "dask-run1")])
def test_get_state_counts_worker_pods_by_kind_prefix(scaler_server, scaler_backend, kind, name):
    scaler_server.add_cluster(kind, name, replicas=2, max_replicas=5, min_replicas=1, worker_tier_id="small-k8s")
    state = scaler_backend.get_state(ClusterRef(kind, name))
    assert (state.status, state.desired_workers, state.existing_workers) == ("Running", 2, 2)
    assert state.ready_workers is None
    assert (state.autoscaling_min, state.autoscaling_max) == (1, 5)
    assert state.worker_hw_tier == "small-k8s"
    assert state.cluster == f"{kind}/{name}"


def test_scale_up_waits_for_pods_to_exist(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=4, pod_ready_delay=0.3)
    seen = []
    result = scaler_backend.scale(RAY, 3, timeout=10, progress=seen.append)
    assert (result.requested, result.effective, result.capped) == (3, 3, False)
    assert result.previous.desired_workers == 1
    assert result.waited and result.final.existing_workers == 3 and result.final.desired_workers == 3
    assert seen[0].current < 3 and seen[-1].current == 3 and seen[-1].target == 3
    assert "not readiness" in seen[-1].what
    assert scaler_server.count("PATCH", "/scale/") == 1


def test_scale_down_waits_until_pods_are_gone(scaler_server, scaler_backend):
    scaler_server.add_cluster("dask", "dask-run1", replicas=3, max_replicas=4, pod_ready_delay=0.2)
    result = scaler_backend.scale(ClusterRef("dask", "dask-run1"), 1, timeout=10)
    assert result.final.existing_workers == 1


def test_a_wait_for_fewer_workers_than_the_cluster_runs_ends_at_once(scaler_server, scaler_backend):
    # An autoscaler (or another client) runs the cluster above the size waited for: that size is a floor.
    scaler_server.add_cluster("ray", "ray-run1", replicas=4, max_replicas=6)
    state = scaler_backend.wait_for_workers(RAY, 2, timeout=5)
    assert (state.desired_workers, state.existing_workers) == (4, 4)


def test_no_wait_returns_the_patched_object_state(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=4, pod_ready_delay=30)
    result = scaler_backend.scale(RAY, 4, wait=False)
    assert not result.waited
    assert result.final.desired_workers == 4 and result.final.existing_workers == 1


def test_not_running_cluster_is_not_done(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=2, cluster_status="Starting")
    with pytest.raises(ScalingTimeoutError) as info:
        scaler_backend.wait_for_workers(RAY, 2, timeout=0.3)
    assert info.value.state.status == "Starting"


def test_capping_reports_the_service_numbers(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=3)
    result = scaler_backend.scale(RAY, 10, timeout=5)
    assert (result.requested, result.effective, result.capped) == (10, 3, True)
    assert result.final.existing_workers == 3


def test_strict_refuses_above_max_before_patching(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=3)
    with pytest.raises(CapacityExceededError) as info:
        scaler_backend.scale(RAY, 4, strict=True)
    assert info.value.state.autoscaling_max == 3
    assert scaler_server.count("PATCH") == 0
    assert scaler_backend.scale(RAY, 3, strict=True, timeout=5).effective == 3


def test_tier_is_sent_under_worker_hw_tier_name(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    result = scaler_backend.scale(RAY, 2, "GPU", timeout=5)
    patches = [r.body for r in scaler_server.requests if r.method == "PATCH"]
    assert patches == [{"replicas": 2, "worker_hw_tier_name": "GPU"}]
    assert result.final.worker_hw_tier == "gpu-k8s" and result.worker_hw_tier == "GPU"


@pytest.mark.parametrize("tier", ["Huge", "Spark Only"])
def test_unknown_or_restricted_tier(scaler_server, scaler_backend, tier):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    with pytest.raises(UnknownTierError) as info:
        scaler_backend.scale(RAY, 2, tier)
    assert info.value.code == "invalid_hw_tier" and info.value.status_code == 400
    assert scaler_server.cluster_object("ray", "ray-run1")["spec"]["worker"]["replicas"] == 1


def test_not_scalable_without_autoscaling_changes_nothing(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", max_replicas=None)
    with pytest.raises(NotScalableError):
        scaler_backend.scale(RAY, 2)
    assert scaler_server.count("PATCH") == 0
    assert scaler_backend.get_baseline(RAY) is None


def test_invalid_autoscaling_is_refused(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", autoscaling={"minReplicas": 1, "maxReplicas": "many"})
    with pytest.raises(NotScalableError):
        scaler_backend.scale(RAY, 2)
    assert scaler_server.count("PATCH") == 0


def test_service_409_invalid_autoscaling_maps_to_not_scalable(scaler_server):
    scaler_server.add_cluster("ray", "ray-run1", autoscaling={"minReplicas": 1})
    client = ScalerClient(scaler_server.url, auth=DominoAuth(api_key=DEFAULT_API_KEY))
    try:
        with pytest.raises(NotScalableError) as info:
            client.scale(RAY, 2, None)
    finally:
        client.close()
    assert info.value.code == "invalid_autoscaling" and info.value.status_code == 409


def test_missing_cluster_is_not_found(scaler_backend):
    with pytest.raises(ClusterNotFoundError) as info:
        scaler_backend.get_state(ClusterRef("spark", "spark-missing"))
    assert info.value.status_code == 500


def test_other_users_cluster_is_unauthorized(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-run1")
    with ScalerServiceBackend(scaler_server.url, api_key=OTHER_API_KEY, state_dir=tmp_path) as backend:
        with pytest.raises(UnauthorizedError) as info:
            backend.scale(RAY, 2)
    assert info.value.status_code == 403
    assert scaler_server.count("PATCH") == 0


@pytest.mark.parametrize(
    "replicas", [-1, 1.5, True, "3", None, 10**6],
)
def test_bad_replicas_rejected_before_any_request(scaler_server, scaler_backend, replicas):
    with pytest.raises(InvalidInputError) as info:
        scaler_backend.scale(RAY, replicas)
    assert info.value.field == "replicas"
    assert scaler_server.requests == []


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.scale(RAY, 1, ""),
        lambda b: b.scale(RAY, 1, timeout=0),
        lambda b: b.scale(RAY, 1, timeout=float("inf")),
        lambda b: b.wait_for_workers(RAY, -2),
        lambda b: b.restart_head(RAY, timeout=-1),
        lambda b: b.restart_head(RAY, head_hw_tier="  "),
        lambda b: b.claim(RAY, "", 2),
        lambda b: b.scale("ray/ray-run1", 1),
    ],
)
def test_other_bad_inputs_rejected_before_any_request(scaler_server, scaler_backend, call):
    with pytest.raises(InvalidInputError):
        call(scaler_backend)
    assert scaler_server.requests == []


@pytest.mark.parametrize("bad", [("ray", ""), ("ray", "Bad_Name"), ("flink", "x")])
def test_bad_refs_are_refused_on_construction(bad):
    with pytest.raises(InvalidInputError):
        ClusterRef(*bad)


def test_mpi_is_unsupported_before_any_request(scaler_server, scaler_backend):
    mpi = ClusterRef("mpi", "mpi-run1")
    for call in (
        lambda: scaler_backend.get_state(mpi),
        lambda: scaler_backend.scale(mpi, 2),
        lambda: scaler_backend.restart_head(mpi),
        lambda: scaler_backend.record_baseline(mpi),
    ):
        with pytest.raises(UnsupportedOperationError):
            call()
    assert scaler_server.requests == []


def test_invalid_kind_answer_maps_to_invalid_input(scaler_server):
    import httpx

    response = httpx.get(f"{scaler_server.url}/ddl_cluster_scaler/cluster/mpiclusters/x")
    error = error_from_response(response, ClusterRef("mpi", "x"), operation="get cluster")
    assert isinstance(error, InvalidInputError) and error.field == "kind"


def test_unexpected_500_keeps_the_service_code(scaler_backend, scaler_server):
    import httpx

    scaler_server.inject_faults("status", count=1, status=500)
    response = httpx.get(f"{scaler_server.url}/ddl_cluster_scaler/cluster/rayclusters/x")
    error = error_from_response(response, RAY, operation="get cluster")
    assert type(error) is ScalingError and error.code == "upstream" and error.status_code == 500
