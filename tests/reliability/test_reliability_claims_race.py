"""Two phases that end and start at the same moment must not shrink each other.

A phase ends (hold/run.py ``ClusterPhase._release``) with two separate
backend calls: ``release`` (which says no claim remains) and then
``reconcile``. If another phase claims the cluster and scales it up
between those two calls, the reconcile must not shrink it under that phase.
The interleaving is reproduced exactly, call by call, with two backend
instances (two processes' worth of state) against each test server.
"""
import time
from typing import Any, Callable

from rel_helpers import desired

from flytekitplugins_ddlscale import ClusterRef

NAME = "ray-race"
REF = ClusterRef("ray", NAME)


def interleave(first: Any, second: Any, sizes: Callable[[], int]) -> None:
    """Phase A (``first``) ends while phase B (``second``) starts, in the racing order."""
    first.claim(REF, "phase-a", 3)
    first.scale(REF, 3, wait=True, timeout=20)
    assert first.release(REF, "phase-a") is None  # A: no claim remains, so A will restore...
    held = second.claim(REF, "phase-b", 2)  # ...but B claims now
    second.scale(REF, held.replicas, wait=True, timeout=20)
    assert sizes() == 2
    first.reconcile(REF, wait=True, timeout=20)  # A's restore, as _release does it


def test_scaler_restore_between_release_and_new_claim_keeps_the_new_phase(make_scaler, scaler_server):
    scaler_server.add_cluster("ray", NAME, replicas=1, max_replicas=6)
    first, second = make_scaler(), make_scaler()
    interleave(first, second, lambda: desired(scaler_server, "ray", NAME))
    assert desired(scaler_server, "ray", NAME) >= 2
    assert "phase-b" in second.records.claims(REF)


def test_k8s_restore_between_release_and_new_claim_keeps_the_new_phase(make_k8s, k8s_server):
    k8s_server.add_cluster("ray", NAME, replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 6})
    first, second = make_k8s(), make_k8s()

    def size() -> int:
        return int(k8s_server.get_object("ray", NAME)["spec"]["worker"]["replicas"])

    interleave(first, second, size)
    assert size() >= 2


def test_overlapping_phases_with_different_tiers_never_run_on_the_wrong_tier_silently(
    scaler_env, scaler_server, make_scaler
):
    from flytekitplugins_ddlscale import ScalingError
    from flytekitplugins_ddlscale.phase import cluster_phase
    from flytekitplugins_ddlscale.backends._support.crds import LABEL_HW_TIER

    scaler_server.add_cluster("ray", NAME, replicas=1, max_replicas=6)

    def worker_tier() -> str:
        return scaler_server.cluster_object("ray", NAME)["spec"]["worker"].get("labels", {}).get(LABEL_HW_TIER)

    options = dict(timeout=20, framework_ready=False, deck=False)
    with cluster_phase(f"ray/{NAME}", 3, worker_hw_tier="Small", **options):
        assert worker_tier() == "small-k8s"
        try:
            with cluster_phase(f"ray/{NAME}", 2, worker_hw_tier="Medium", **options):
                tier_in_body = worker_tier()
        except ScalingError as refused:
            assert "Medium" in str(refused) and "Small" in str(refused)
        else:
            assert tier_in_body == "medium-k8s"
    assert desired(scaler_server, "ray", NAME) == 1


def test_a_briefly_live_claim_of_another_tier_never_retiers_a_running_phase(scaler_env, scaler_server, make_scaler):
    # Phase B claims 5 "Medium" workers and, seeing phase A hold "Small" ones, refuses and releases.
    # While B's claim is live, A's monitor re-asserts (the scaler backend cannot hold a size) and must
    # not adopt B's larger claim with B's tier: A's body would have its workers replaced mid-run.
    from flytekitplugins_ddlscale.phase import cluster_phase

    scaler_server.add_cluster("ray", NAME, replicas=1, max_replicas=6)
    other = make_scaler()
    options = dict(timeout=20, framework_ready=False, deck=False, reassert_interval=0.05, sample_interval=0.05)
    with cluster_phase(f"ray/{NAME}", 3, worker_hw_tier="Small", **options):
        other.claim(REF, "phase-b", 5, "Medium")
        try:
            time.sleep(0.5)  # several re-assert intervals of A's monitor
        finally:
            other.release(REF, "phase-b")
    tiers = [
        r.body.get("worker_hw_tier_name")
        for r in scaler_server.requests
        if r.method == "PATCH" and "/scale/" in r.path and r.status == 200
    ]
    assert "Medium" not in tiers, tiers
