"""@distributed_phase through the scaler-service backend, on its protocol-true test server.

The service only sets ``spec.worker.replicas`` (``holds_size`` is False), so
here the phase must re-assert its size when something else (the HPA) pulls
it back; claims must keep concurrent phases from shrinking each other.
"""
import dataclasses
import logging
import time

import httpx
import pytest

from flytekitplugins_ddlscale._services.hold.monitor import NOT_RECLAIMED
from flytekitplugins_ddlscale.errors import ConflictError, UnknownTierError, UnsupportedOperationError
from flytekitplugins_ddlscale.models import ReplicaSpec
from flytekitplugins_ddlscale.phase import cluster_phase
from tests.servers.scaler_server import ADMIN_API_KEY, DEFAULT_API_KEY, ScalerTestServer

CLUSTER = "ray/ray-phase"


@pytest.fixture
def server(tmp_path, monkeypatch):
    """The test server with one Ray cluster (1 worker, max 6), selected purely through the environment."""
    with ScalerTestServer() as srv:
        srv.add_cluster("ray", "ray-phase", replicas=1, max_replicas=6, min_replicas=1)
        for name in ("DOMINO_API_PROXY", "DOMINO_TOKEN", "DOMINO_RUN_ID"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("CLUSTER_SCALER_BASE_URL", srv.url)
        monkeypatch.setenv("DOMINO_API_KEY", DEFAULT_API_KEY)
        monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "state"))
        monkeypatch.delenv("DDLSCALE_BACKEND", raising=False)
        yield srv


def replicas(server):
    return server.cluster_object("ray", "ray-phase")["spec"]["worker"]["replicas"]


def hpa_scales_to(server, count):
    """What the HPA does: another writer sets spec.worker.replicas (here via the service, as an admin)."""
    reply = httpx.patch(
        f"{server.url}/ddl_cluster_scaler/scale/rayclusters/ray-phase",
        json={"replicas": count},
        headers={"X-Domino-Api-Key": ADMIN_API_KEY},
        timeout=5,
    )
    assert reply.status_code == 200, reply.text


def test_phase_reasserts_its_size_when_the_autoscaler_pulls_it_back(server, caplog):
    caplog.set_level(logging.WARNING, logger="flytekitplugins_ddlscale")
    with cluster_phase(CLUSTER, 4, timeout=30, reassert_interval=0.1, sample_interval=0.1) as phase:
        assert phase.backend.name == "scaler" and replicas(server) == 4
        hpa_scales_to(server, 1)
        deadline = time.monotonic() + 10
        while replicas(server) != 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert replicas(server) == 4
    assert "autoscaler pulled ray/ray-phase back to 1 workers (phase needs 4)" in caplog.text
    assert replicas(server) == 1


def test_overlapping_phases_hold_the_largest_claim(server):
    with cluster_phase(CLUSTER, 3, timeout=30, reassert_interval=None) as big:
        with cluster_phase(CLUSTER, 2, timeout=30, reassert_interval=None) as small:
            assert small.claim.replicas == 3 and replicas(server) == 3
        assert replicas(server) == 3 and small.restored_to.startswith("3 workers")
        with cluster_phase(CLUSTER, 5, timeout=30, reassert_interval=None):
            assert replicas(server) == 5
        assert replicas(server) == 3
        assert big.restored_to is None
    assert replicas(server) == 1


def test_overlapping_phases_on_one_tier_or_without_one_share_the_cluster(server):
    options = dict(timeout=30, reassert_interval=None, framework_ready=False, deck=False)
    with cluster_phase(CLUSTER, 3, worker_hw_tier="Medium", **options):
        with cluster_phase(CLUSTER, 2, worker_hw_tier="Medium", **options) as same:
            assert same.claim.replicas == 3
        with cluster_phase(CLUSTER, 2, **options) as any_tier:
            assert any_tier.claim.worker_hw_tier == "Medium"
        assert replicas(server) == 3
    assert replicas(server) == 1


def test_a_phase_refused_for_its_tier_leaves_the_holder_alone(server):
    options = dict(timeout=30, reassert_interval=None, framework_ready=False, deck=False)
    with cluster_phase(CLUSTER, 3, worker_hw_tier="Small", **options):
        with pytest.raises(ConflictError) as refused:
            with cluster_phase(CLUSTER, 5, worker_hw_tier="Medium", **options):
                pytest.fail("the body must not run on the wrong tier")
        assert "'Medium'" in str(refused.value) and "'Small'" in str(refused.value)
        tier = server.cluster_object("ray", "ray-phase")["spec"]["worker"].get("labels", {})
        assert replicas(server) == 3 and "small-k8s" in tier.values()
    assert replicas(server) == 1


def test_restore_to_an_explicit_spec(server):
    with cluster_phase(CLUSTER, 4, restore=ReplicaSpec(2), timeout=30, reassert_interval=None):
        assert replicas(server) == 4
    assert replicas(server) == 2


def test_restore_failure_is_attached_to_the_body_error(server, caplog):
    broken = ReplicaSpec(replicas=1, worker_hw_tier="NoSuchTier")
    with pytest.raises(KeyError) as info:
        with cluster_phase(CLUSTER, 3, restore=broken, timeout=30, reassert_interval=None):
            raise KeyError("body failed")
    assert isinstance(info.value.ddlscale_restore_error, UnknownTierError)
    assert any("restoring ray/ray-phase" in note for note in getattr(info.value, "__notes__", []))
    assert "could not restore ray/ray-phase" in caplog.text


def test_restore_failure_after_a_good_body_is_raised(server):
    with pytest.raises(UnknownTierError):
        with cluster_phase(CLUSTER, 3, restore=ReplicaSpec(1, "NoSuchTier"), timeout=30, reassert_interval=None):
            pass


def test_failed_scale_up_releases_and_restores(server):
    with pytest.raises(UnknownTierError):
        with cluster_phase(CLUSTER, 3, worker_hw_tier="Spark Only", timeout=30):
            pytest.fail("body must not run")
    assert replicas(server) == 1


def test_unserved_kind_is_refused_before_any_request(server):
    server.clear_requests()
    with pytest.raises(UnsupportedOperationError):
        with cluster_phase("mpi/mpi-phase", 2, timeout=30):
            pytest.fail("body must not run")
    assert server.requests == []


def test_a_phase_renews_its_claim_through_a_long_scale_up_wait_and_its_body(server):
    from flytekitplugins_ddlscale._core.leases import expires_at
    from flytekitplugins_ddlscale.models import utcnow

    # A 2 s lease renewed every third of it: only a renewal over 2 s late would let it lapse here.
    server.set_pod_ready_delay(4.5)  # the wait outlasts the lease twice over
    with cluster_phase(CLUSTER, 3, timeout=60, reassert_interval=None, lease_seconds=2.0) as phase:
        claim = phase.backend.claims(phase.ref)[phase.claim_id]
        assert utcnow() > expires_at(dataclasses.replace(claim, renewed_at=claim.created_at))  # renewed in the wait
        deadline = time.monotonic() + 30
        while utcnow() <= expires_at(claim) and time.monotonic() < deadline:  # and through the body
            time.sleep(0.1)
        assert utcnow() > expires_at(claim), "the body never outlived the lease it started with"
        assert phase.claim_id in phase.backend.claims(phase.ref) and replicas(server) == 3
        assert phase.faults == []
    assert replicas(server) == 1 and phase.backend.claims(phase.ref) == {}


def test_the_monitor_does_not_re_add_a_claim_ddlscale_restore_dropped(server, caplog):
    caplog.set_level(logging.WARNING, logger="flytekitplugins_ddlscale")
    with cluster_phase(CLUSTER, 4, timeout=30, reassert_interval=0.1, sample_interval=0.1) as phase:
        phase.backend.restore_baseline(phase.ref, timeout=30)  # the operator's override
        hpa_scales_to(server, 2)
        time.sleep(0.5)  # several re-assert ticks
        assert phase.backend.claims(phase.ref) == {} and replicas(server) == 2
    # Dropped while renewed on time: a fault, reported and never claimed again.
    assert (f"the claim of phase {phase.claim_id} on ray/ray-phase was dropped from the record while it was "
            "renewed on time") in caplog.text
    assert [fault.action for fault in phase.faults] == [NOT_RECLAIMED]
