"""Baselines, claims and restore through the scaler backend (records in files)."""
import json

import pytest

from flytekitplugins_ddlscale import ClusterRef, CorruptRecordError, InvalidInputError, ReplicaSpec, UnsupportedOperationError
from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend
from flytekitplugins_ddlscale.backends.tiers import StaticTierCatalog, parse_tiers
from tests.servers.scaler_server import DEFAULT_API_KEY

RAY = ClusterRef("ray", "ray-run1")


def test_first_scale_records_the_baseline_once(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=5, min_replicas=1, worker_tier_id="small-k8s")
    scaler_backend.scale(RAY, 3, timeout=5)
    scaler_backend.scale(RAY, 4, timeout=5)
    baseline = scaler_backend.get_baseline(RAY)
    assert (baseline.replicas, baseline.autoscaling_max, baseline.worker_hw_tier) == (1, 5, "small-k8s")
    assert scaler_backend.record_baseline(RAY).replicas == 1


def test_restore_puts_the_baseline_back_and_forgets_it(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    scaler_backend.scale(RAY, 3, timeout=5)
    result = scaler_backend.restore_baseline(RAY, timeout=5)
    assert result.effective == 1 and result.final.existing_workers == 1
    assert scaler_backend.get_baseline(RAY) is None


def test_restore_without_baseline_or_target_is_bad_input(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    with pytest.raises(InvalidInputError) as info:
        scaler_backend.restore_baseline(RAY)
    assert info.value.field == "target"
    assert scaler_server.count("PATCH") == 0


def test_restore_to_an_explicit_target(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    assert scaler_backend.restore_baseline(RAY, ReplicaSpec(2, "Medium"), timeout=5).final.worker_hw_tier == "medium-k8s"
    with pytest.raises(InvalidInputError):
        scaler_backend.restore_baseline(RAY, ReplicaSpec(-1))
    with pytest.raises(UnsupportedOperationError):
        scaler_backend.restore_baseline(RAY, ReplicaSpec(1, head_hw_tier="Medium"))
    assert scaler_server.count("PATCH") == 1


def test_restore_maps_the_recorded_tier_id_back_to_its_name(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, worker_tier_id="small-k8s")
    catalog = StaticTierCatalog(parse_tiers({"hardwareTiers": scaler_server.tiers}))
    with ScalerServiceBackend(scaler_server.url, api_key=DEFAULT_API_KEY, state_dir=tmp_path, tier_catalog=catalog) as backend:
        backend.scale(RAY, 2, "Medium", wait=False)
        result = backend.restore_baseline(RAY, wait=False)
    assert result.worker_hw_tier == "Small" and result.final.worker_hw_tier == "small-k8s"


def test_restore_without_catalog_restores_replicas_and_warns(scaler_server, scaler_backend, caplog):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, worker_tier_id="small-k8s")
    scaler_backend.scale(RAY, 2, "Medium", wait=False)
    with caplog.at_level("WARNING"):
        result = scaler_backend.restore_baseline(RAY, wait=False)
    assert result.effective == 1 and result.final.worker_hw_tier == "medium-k8s"
    assert "not the worker tier 'small-k8s'" in caplog.text


def test_claims_hold_the_largest_and_release_returns_what_remains(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    assert scaler_backend.claim(RAY, "phase-a", 2).claim_id == "phase-a"
    assert scaler_backend.claim(RAY, "phase-b", 4).replicas == 4
    assert scaler_backend.claim(RAY, "phase-c", 3).claim_id == "phase-b"
    assert scaler_backend.get_baseline(RAY).replicas == 1
    assert scaler_backend.release(RAY, "phase-b").claim_id == "phase-c"
    assert scaler_backend.release(RAY, "phase-c").claim_id == "phase-a"
    assert scaler_backend.release(RAY, "phase-a") is None
    assert scaler_backend.release(RAY, "never-claimed") is None


def test_records_are_shared_by_backends_using_the_same_state_dir(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    first = ScalerServiceBackend(scaler_server.url, api_key=DEFAULT_API_KEY, state_dir=tmp_path)
    second = ScalerServiceBackend(scaler_server.url, api_key=DEFAULT_API_KEY, state_dir=tmp_path)
    with first, second:
        first.claim(RAY, "a", 3)
        assert second.claim(RAY, "b", 2).claim_id == "a"
        assert second.get_baseline(RAY).replicas == 1


def test_tier_catalog_refuses_unknown_tiers_before_any_request(scaler_server, tmp_path):
    from flytekitplugins_ddlscale import UnknownTierError

    catalog = StaticTierCatalog(parse_tiers({"hardwareTiers": scaler_server.tiers}))
    with ScalerServiceBackend(scaler_server.url, api_key=DEFAULT_API_KEY, state_dir=tmp_path, tier_catalog=catalog) as backend:
        with pytest.raises(UnknownTierError):
            backend.scale(RAY, 2, "Spark Only")
    assert scaler_server.requests == []


def test_restore_drops_claims_left_by_dead_processes(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    scaler_backend.claim(RAY, "killed-phase", 4)
    scaler_backend.scale(RAY, 4, wait=False)
    scaler_backend.restore_baseline(RAY, wait=False)
    assert scaler_backend.claim(RAY, "next-phase", 2).claim_id == "next-phase"


def test_nucleus_catalog_from_the_environment_refuses_tiers_before_patching(scaler_server, tmp_path):
    from flytekitplugins_ddlscale import UnknownTierError

    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    env = {"DOMINO_API_KEY": DEFAULT_API_KEY, "DOMINO_API_HOST": scaler_server.url}
    with ScalerServiceBackend(scaler_server.url, state_dir=tmp_path, env=env) as backend:
        with pytest.raises(UnknownTierError) as info:
            backend.scale(RAY, 2, "Spark Only")
        assert "Small" in str(info.value) and "Medium" in str(info.value)
        assert scaler_server.count("PATCH") == 0
        assert backend.scale(RAY, 2, "Medium", wait=False).final.worker_hw_tier == "medium-k8s"
    assert scaler_server.count("GET", "/v4/hardwareTier") == 1


def test_unreachable_nucleus_leaves_the_tier_to_the_service(scaler_server, tmp_path, caplog):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    with ScalerServiceBackend(
        scaler_server.url, api_key=DEFAULT_API_KEY, state_dir=tmp_path, nucleus_url="http://127.0.0.1:9"
    ) as backend:
        assert backend.scale(RAY, 2, "Medium", wait=False).effective == 2
    assert "could not check tier" in caplog.text


@pytest.mark.parametrize("replicas", [-5, "abc", 1000000000])
def test_a_corrupt_baseline_record_is_refused_before_anything_is_sent(scaler_server, scaler_backend, replicas):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    scaler_backend.scale(RAY, 3, timeout=5)
    path = scaler_backend.records.store.path(RAY)
    record = json.loads(path.read_text())
    baseline = json.loads(record["baseline"])
    record["baseline"] = json.dumps({**baseline, "replicas": replicas})
    path.write_text(json.dumps(record))
    patches = scaler_server.count("PATCH")
    with pytest.raises(CorruptRecordError) as caught:
        scaler_backend.restore_baseline(RAY, timeout=5)
    assert (caught.value.field, caught.value.value) == ("baseline.replicas", replicas)
    assert str(path) in str(caught.value) and "an integer from 0 to 1000" in str(caught.value)
    assert scaler_server.count("PATCH") == patches
    assert scaler_server.cluster_object("ray", "ray-run1")["spec"]["worker"]["replicas"] == 3


def test_a_corrupt_claim_record_is_refused_before_anything_is_sent(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    scaler_backend.claim(RAY, "phase-a", 2)
    path = scaler_backend.records.store.path(RAY)
    record = json.loads(path.read_text())
    claims = json.loads(record["claims"])
    claims["phase-a"]["replicas"] = -5
    path.write_text(json.dumps({**record, "claims": json.dumps(claims)}))
    patches = scaler_server.count("PATCH")
    with pytest.raises(CorruptRecordError, match=r"claims\['phase-a'\].replicas=-5"):
        scaler_backend.reconcile(RAY, timeout=5)
    path.write_text("not json")
    with pytest.raises(CorruptRecordError, match="record='not json'"):
        scaler_backend.claims(RAY)
    assert scaler_server.count("PATCH") == patches
