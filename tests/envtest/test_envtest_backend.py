"""The Kubernetes backend's contract, run on the test server and on a real kube-apiserver alike.

Each test runs twice (the ``side`` fixture): against the repository's test
server and, marked ``envtest``, against the real control plane with the DCO
stand-in and the fake kubelet. Only what both sides offer is used, so a
difference between the test server and Kubernetes fails here.
"""
from dataclasses import replace
from pathlib import Path

import pytest

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.errors import ScalingTimeoutError, UnauthorizedError
from flytekitplugins_ddlscale._core.records import BASELINE_ANNOTATION, CLAIMS_ANNOTATION

AUTO = {"minReplicas": 1, "maxReplicas": 5}
TIER_LABEL = "dominodatalab.com/hardware-tier-id"
RBAC = Path(__file__).resolve().parents[2] / "examples" / "k8s" / "rbac.yaml"


def _notes(side, kind, name):
    return side.get_object(kind, name)["metadata"].get("annotations") or {}


@pytest.mark.parametrize("kind", ["ray", "spark", "dask"])
def test_scale_up_holds_the_size_by_raising_min_replicas(side, kind):
    side.add_cluster(kind, "c1", replicas=1, autoscaling=AUTO)
    ref = ClusterRef(kind, "c1", side.namespace)
    with side.backend() as backend:
        result = backend.scale(ref, 3, timeout=60)
        # Scaled means 3 Ready worker pods; the operator writes its status after it sees them (an event
        # later: on the real API server the scale's final read can come first and say Starting).
        side.wait_for(lambda: backend.get_state(ref).status == "Running", "the operator's status Running")
    assert (result.requested, result.effective, result.capped) == (3, 3, False)
    assert result.previous.ready_workers == 1 and result.final.ready_workers == 3
    assert result.final.head_ready is True and result.final.status in ("Starting", "Running")
    obj = side.get_object(kind, "c1")
    assert obj["spec"]["worker"]["replicas"] == 3
    assert obj["spec"]["autoscaling"] == {"minReplicas": 3, "maxReplicas": 5}
    assert BASELINE_ANNOTATION in obj["metadata"]["annotations"]
    assert side.ready_workers("c1", kind) == 3


def test_scale_down_waits_for_the_pods_to_go_and_restore_brings_them_back(side):
    side.add_cluster("dask", "d1", replicas=3)
    ref = ClusterRef("dask", "d1", side.namespace)
    with side.backend() as backend:
        result = backend.scale(ref, 1, timeout=60)
        assert (result.final.existing_workers, result.final.ready_workers) == (1, 1)
        # A real API server keeps a deleted pod Terminating until its kubelet confirms; the backend
        # counts it as gone already. The test server removes it at once (terminate_delay=0).
        alive = [p for p in side.pods("d1", "worker") if not p["metadata"].get("deletionTimestamp")]
        assert [p["metadata"]["name"] for p in alive] == ["d1-dask-worker-0"]
        side.wait_for(lambda: len(side.pods("d1", "worker")) == 1, "the removed workers to be gone")
        restored = backend.restore_baseline(ref, timeout=60)
    assert restored.final.ready_workers == 3 and side.ready_workers("d1") == 3
    assert BASELINE_ANNOTATION not in _notes(side, "dask", "d1")


def test_mpi_scales_without_a_head(side):
    side.add_cluster("mpi", "m1", replicas=1)
    with side.backend() as backend:
        result = backend.scale(ClusterRef("mpi", "m1", side.namespace), 2, timeout=60)
    assert result.final.ready_workers == 2 and result.final.head_ready is None


def test_zero_workers_removes_autoscaling_and_restore_puts_it_back(side):
    auto = {"minReplicas": 2, "maxReplicas": 6, "averageCPUUtilization": 70}
    side.add_cluster("spark", "s1", replicas=2, autoscaling=auto)
    ref = ClusterRef("spark", "s1", side.namespace)
    with side.backend() as backend:
        result = backend.scale(ref, 0, timeout=60)
        assert result.final.ready_workers == 0
        spec = side.get_object("spark", "s1")["spec"]
        assert "autoscaling" not in spec and spec["worker"]["replicas"] == 0
        restored = backend.restore_baseline(ref, timeout=60)
    assert restored.final.ready_workers == 2
    assert side.get_object("spark", "s1")["spec"]["autoscaling"] == auto


def test_a_worker_tier_change_rolls_the_workers_onto_the_tier(side):
    side.add_cluster("ray", "c1", replicas=1, autoscaling=AUTO, worker_tier="small-k8s")
    ref = ClusterRef("ray", "c1", side.namespace)
    with side.backend() as backend:
        result = backend.scale(ref, 2, "gpu", timeout=60)
    assert result.final.worker_hw_tier == "gpu-k8s"
    worker = side.get_object("ray", "c1")["spec"]["worker"]
    assert worker["resources"]["requests"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    assert worker["nodeSelector"] == {"dominodatalab.com/node-pool": "gpu-pool"}
    side.wait_for(lambda: len(side.pods("c1", "worker")) == 2 and all(
        p["metadata"]["labels"].get(TIER_LABEL) == "gpu-k8s" for p in side.pods("c1", "worker")),
        "both workers on the gpu tier")


@pytest.mark.parametrize("kind, component", [("ray", "head"), ("dask", "scheduler")])
def test_head_restart_replaces_the_pod_under_its_name(side, kind, component):
    side.add_cluster(kind, "c1", replicas=1)
    old = side.pods("c1", component)[0]
    with side.backend() as backend:
        result = backend.restart_head(ClusterRef(kind, "c1", side.namespace), timeout=60)
    assert result.ready and result.final.head_ready and result.pod == old["metadata"]["name"]
    new = side.pods("c1", component)
    assert [p["metadata"]["name"] for p in new] == [old["metadata"]["name"]]
    assert new[0]["metadata"]["uid"] != old["metadata"]["uid"]
    assert new[0]["metadata"]["creationTimestamp"] >= old["metadata"]["creationTimestamp"]


def test_a_restart_sent_without_waiting_is_seen_done_only_on_a_new_ready_head(side):
    """What the Flyte connector relies on: ``restart_head(wait=False)`` names the pod it replaced, and
    ``head_restarted`` tells the new head (same name, new uid) from it without sending anything."""
    side.add_cluster("ray", "c1", replicas=1)
    old = side.pods("c1", "head")[0]
    ref = ClusterRef("ray", "c1", side.namespace)
    with side.backend() as backend:
        sent = backend.restart_head(ref, wait=False, timeout=30)
        assert sent.replaced_uid == old["metadata"]["uid"] and not sent.waited
        side.wait_for(lambda: backend.head_restarted(ref, sent)[0], "the new head to be seen Ready")
        new = side.pods("c1", "head")[0]
        assert new["metadata"]["name"] == old["metadata"]["name"] and new["metadata"]["uid"] != old["metadata"]["uid"]
        # Had the running head been the one replaced, nothing would be done yet.
        assert backend.head_restarted(ref, replace(sent, replaced_uid=new["metadata"]["uid"]))[0] is False
    assert side.pods("c1", "head")[0]["metadata"]["uid"] == new["metadata"]["uid"]  # no second restart


def test_head_restart_on_a_new_tier_rolls_the_head(side):
    side.add_cluster("spark", "s1", replicas=1, head_tier="small-k8s")
    old = side.pods("s1", "master")[0]
    ref = ClusterRef("spark", "s1", side.namespace)
    with side.backend() as backend:
        result = backend.restart_head(ref, "medium", timeout=60)
        assert result.final.head_hw_tier == "medium-k8s"
        assert backend.get_baseline(ref).head_hw_tier == "small-k8s"
    new = side.pods("s1", "master")[0]
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["metadata"]["labels"][TIER_LABEL] == "medium-k8s"


def test_a_timed_out_wait_carries_the_last_state_and_progress_names_the_cluster(side):
    side.add_cluster("spark", "s1", replicas=1)
    ref = ClusterRef("spark", "s1", side.namespace)
    side.set_ready_delay(120, cluster="s1")
    seen = []
    with side.backend() as backend:
        backend.scale(ref, 2, wait=False)
        # The pod exists before the wait starts (a loaded machine may take seconds to create it).
        side.wait_for(lambda: len(side.pods("s1", "worker")) == 2, "the second worker pod")
        with pytest.raises(ScalingTimeoutError) as caught:
            backend.wait_for_workers(ref, 2, timeout=1, progress=seen.append)
    state = caught.value.state
    assert (state.desired_workers, state.existing_workers, state.ready_workers) == (2, 2, 1)
    assert "2 Ready workers" in str(caught.value)
    assert seen and seen[-1].target == 2 and "s1" in seen[-1].what


def test_claims_reconcile_to_the_largest_then_the_baseline(side):
    side.add_cluster("ray", "c1", replicas=1, autoscaling=AUTO)
    ref = ClusterRef("ray", "c1", side.namespace)
    with side.backend() as backend:
        backend.claim(ref, "a", 2)
        backend.claim(ref, "b", 3)
        assert backend.reconcile(ref, timeout=60).final.ready_workers == 3
        backend.release(ref, "b")
        assert backend.reconcile(ref, timeout=60).final.ready_workers == 2
        backend.release(ref, "a")
        assert backend.reconcile(ref, timeout=60).final.ready_workers == 1
    notes = _notes(side, "ray", "c1")
    assert CLAIMS_ANNOTATION not in notes and BASELINE_ANNOTATION not in notes
    assert side.get_object("ray", "c1")["spec"]["autoscaling"] == AUTO


def test_foreign_clusters_are_refused_unless_allowed(side):
    side.add_cluster("ray", "c1", replicas=1, owner="alice")
    ref = ClusterRef("ray", "c1", side.namespace)
    with side.backend(owner="bob") as bobs:
        assert bobs.get_state(ref).ready_workers == 1
        with pytest.raises(UnauthorizedError, match="alice"):
            bobs.scale(ref, 2)
    assert side.get_object("ray", "c1")["spec"]["worker"]["replicas"] == 1
    with side.backend(owner="bob", allow_foreign=True) as anyone:
        assert anyone.scale(ref, 2, timeout=60).final.ready_workers == 2


def test_without_the_role_the_user_gets_a_clear_403(side):
    side.add_cluster("ray", "c1", replicas=1)
    with side.backend(user=True) as backend:
        with pytest.raises(UnauthorizedError) as caught:
            backend.scale(ClusterRef("ray", "c1", side.namespace), 2, timeout=30)
    error = caught.value
    assert error.status_code == 403
    assert "refused to get rayclusters" in str(error)
    assert 'User "system:serviceaccount:domino-compute:flyte-runner" cannot get resource "rayclusters"' in str(error)
    assert side.get_object("ray", "c1")["spec"]["worker"]["replicas"] == 1


@pytest.mark.parametrize(
    "verb, resource, operation",
    [("patch", "rayclusters", "scale"), ("watch", "pods", "scale"), ("delete", "pods", "restart")],
)
def test_a_role_without_one_permission_gets_a_403_naming_it(side, verb, resource, operation):
    side.add_cluster("ray", "c1", replicas=1)
    side.grant(RBAC, without=(verb, resource))
    side.set_ready_delay(1.0, cluster="c1")  # so a scale's wait has to watch
    ref = ClusterRef("ray", "c1", side.namespace)
    with side.backend(user=True) as backend:
        with pytest.raises(UnauthorizedError) as caught:
            if operation == "scale":
                backend.scale(ref, 2, timeout=30)
            else:
                backend.restart_head(ref, timeout=30)
    assert caught.value.status_code == 403
    assert f"refused to {verb} {resource}" in str(caught.value)
    assert f'cannot {verb} resource "{resource}"' in str(caught.value)


def test_the_shipped_role_allows_every_operation(side):
    side.add_cluster("ray", "c1", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 3})
    side.add_cluster("mpi", "c1", replicas=1)
    side.grant(RBAC)
    ref = ClusterRef("ray", "c1", side.namespace)
    with side.backend(user=True) as backend:
        backend.scale(ref, 0, timeout=60)
        backend.claim(ref, "p", 2)
        backend.scale(ref, 2, "small", timeout=60)
        backend.restart_head(ref, timeout=60)
        backend.restart_head(ref, "medium", timeout=60)
        backend.release(ref, "p")
        assert backend.restore_baseline(ref, timeout=60).final.ready_workers == 1
        assert backend.scale(ClusterRef("mpi", "c1", side.namespace), 2, timeout=60).final.ready_workers == 2
        assert backend.wait_for_workers(ref, 1, timeout=60).ready_workers == 1
