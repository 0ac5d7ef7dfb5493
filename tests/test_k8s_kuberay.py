"""KubeRay RayClusters (kind ``kuberay``) on the Kubernetes backend, against the test server's
RayCluster CRD facts and simulated KubeRay operator and Ray autoscaler."""
import re
import time
from pathlib import Path

import pytest
from kubernetes import client
from tests.servers.k8s_fixtures import backend, k8s, make_backend, role_rules, tiers_file  # noqa: F401 - fixtures
from tests.servers.ray_dashboard import RayDashboardServer

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.kubernetes._resources.base import removal_order
from flytekitplugins_ddlscale.errors import (
    CapacityExceededError,
    ConflictError,
    InvalidInputError,
    NotScalableError,
    ScalingTimeoutError,
    UnauthorizedError,
    WorkerFailedError,
)
from flytekitplugins_ddlscale.models import ReplicaSpec
from flytekitplugins_ddlscale._core.records import BASELINE_ANNOTATION, CLAIMS_ANNOTATION
from flytekitplugins_ddlscale.refs import parse_cluster

RAY = "rayclusters.ray.io"
ROLE = Path(__file__).resolve().parents[1] / "examples" / "k8s" / "kuberay-rbac.yaml"
REF = ClusterRef("kuberay", "r1")


def _group(server, name="workers", cluster="r1"):
    obj = server.get_resource(RAY, cluster)
    return next(g for g in obj["spec"]["workerGroupSpecs"] if g["groupName"] == name)


def _workers(server, group="workers", cluster="r1", ready=None):
    return server.select_pods(ready=ready, **{"ray.io/cluster": cluster, "ray.io/group": group, "ray.io/node-type": "worker"})


def _names(pods):
    return {p["metadata"]["name"] for p in pods}


def _patches(server):
    return [r for r in server.requests if r.method == "PATCH"]


def test_scale_up_and_down_names_the_workers_to_delete(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 1, "maxReplicas": 6}], autoscaling=True)
    result = backend.scale(REF, 4, timeout=20)
    assert (result.requested, result.effective, result.capped) == (4, 4, False)
    assert result.final.ready_workers == 4 and len(_workers(k8s, ready=True)) == 4
    assert _group(k8s)["replicas"] == 4 and _group(k8s)["minReplicas"] == 4
    patch = _patches(k8s)[-1]
    assert patch.path == "/apis/ray.io/v1/namespaces/domino-compute/rayclusters/r1"
    assert patch.content_type.startswith("application/merge-patch+json")
    created = {p["metadata"]["name"]: p["metadata"]["creationTimestamp"] for p in _workers(k8s)}
    k8s.clear_log()
    down = backend.scale(REF, 2, timeout=20)
    assert down.final.ready_workers == 2 and down.final.desired_workers == 2
    # With autoscaling on KubeRay deletes only the listed pods: the newest (all were Ready).
    listed = _patches(k8s)[0].body["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"]
    kept = _names(_workers(k8s))
    assert len(listed) == 2 and len(kept) == 2 and not set(listed) & kept
    assert max(created[name] for name in kept) <= min(created[name] for name in listed)
    # KubeRay clears the list only in its own memory: the object keeps the names of pods long gone.
    assert _group(k8s)["scaleStrategy"]["workersToDelete"] == listed


def test_names_of_pods_gone_are_dropped_from_workers_to_delete(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 3, "maxReplicas": 6}], autoscaling=True)
    backend.scale(REF, 2, timeout=20)
    gone = _group(k8s)["scaleStrategy"]["workersToDelete"]
    assert len(gone) == 1 and gone[0] not in _names(_workers(k8s))
    k8s.clear_log()
    backend.scale(REF, 1, timeout=20)
    listed = _patches(k8s)[0].body["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"]
    assert len(listed) == 1 and gone[0] not in listed and len(_workers(k8s)) == 1
    k8s.clear_log()
    backend.restore_baseline(REF, timeout=20)  # a scale-up drops the gone names too
    assert _group(k8s)["scaleStrategy"]["workersToDelete"] == [] and len(_workers(k8s, ready=True)) == 3


def test_a_multi_host_group_counts_pods_and_removes_whole_replicas(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "tpu", "replicas": 1, "numOfHosts": 2, "maxReplicas": 3}],
                    autoscaling=True)
    ref = parse_cluster("kuberay/r1@tpu")
    state = backend.get_state(ref)
    assert (state.desired_workers, state.existing_workers, state.autoscaling_max) == (2, 2, 6)
    k8s.clear_log()
    with pytest.raises(InvalidInputError, match=r"numOfHosts 2") as caught:
        backend.scale(ref, 3, timeout=20)
    assert caught.value.field == "replicas" and "'tpu'" in str(caught.value) and _patches(k8s) == []
    with pytest.raises(InvalidInputError, match=r"numOfHosts"):
        backend.claim(ref, "p", 5)
    assert _patches(k8s) == []
    with pytest.raises(CapacityExceededError, match=r"maxReplicas 3 of 2 pods each \(numOfHosts\), 6 workers"):
        backend.scale(ref, 8, strict=True, timeout=20)
    up = backend.scale(ref, 6, timeout=20)
    assert (up.effective, up.final.ready_workers) == (6, 6)
    assert (_group(k8s, "tpu")["replicas"], _group(k8s, "tpu")["minReplicas"]) == (3, 3)
    k8s.clear_log()
    down = backend.scale(ref, 2, timeout=20)
    assert down.final.existing_workers == 2
    listed = _patches(k8s)[0].body["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"]
    assert len(listed) == 2  # one pod of each replica going; KubeRay takes its partner with it
    replicas = {p["metadata"]["labels"]["ray.io/worker-group-replica-name"] for p in _workers(k8s, "tpu")}
    assert len(replicas) == 1
    assert backend.restore_baseline(ref, timeout=20).effective == 2 and _group(k8s, "tpu")["replicas"] == 1


def test_a_suspended_group_has_no_workers_and_is_refused(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 2, "suspend": True}])
    state = backend.get_state(REF)
    assert (state.desired_workers, state.existing_workers) == (0, 0)
    k8s.clear_log()
    field = "spec.workerGroupSpecs[groupName=workers].suspend"
    with pytest.raises(NotScalableError, match=re.escape(field)) as caught:
        backend.scale(REF, 3, timeout=20)
    assert "'workers'" in str(caught.value)
    with pytest.raises(NotScalableError, match=re.escape(field)):
        backend.claim(REF, "p", 3)
    assert _patches(k8s) == [] and _workers(k8s) == []


@pytest.mark.parametrize("token", [None, "ray-token-5d1e"])
def test_a_scale_down_removes_the_workers_the_ray_head_reports_idle(k8s, tiers_file, token, monkeypatch):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 3, "maxReplicas": 6}], autoscaling=True)
    if token is not None:  # a head with Ray's token authentication gets the token configured as Ray reads it
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    workers = removal_order(_workers(k8s))
    idle = workers[-1]  # the one today's rule (the newest first) would keep longest
    with RayDashboardServer(token=token) as head:
        for pod in workers:
            head.node(pod["status"]["podIP"], busy=pod is not idle)
        with make_backend(k8s, tiers_file, ray_dashboard=head.url) as backend:
            k8s.clear_log()
            backend.scale(REF, 2, timeout=20)
            listed = _patches(k8s)[0].body["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"]
            assert listed == [idle["metadata"]["name"]]
            assert idle["metadata"]["name"] not in _names(_workers(k8s))
            # A head that does not answer leaves today's rule: the newest goes.
            head.stop()
            newest = removal_order(_workers(k8s))[0]
            k8s.clear_log()
            backend.scale(REF, 1, timeout=20)
            listed = _patches(k8s)[0].body["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"]
            assert listed == [newest["metadata"]["name"]]


def test_pods_that_are_not_ready_are_removed_first(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 2}])
    healthy = _names(_workers(k8s))
    k8s.set_ready_delay(60, "r1")
    backend.scale(REF, 3, wait=False)
    k8s.wait_for(lambda: len(_workers(k8s)) == 3, 10, "a third, pending worker")
    pending = _names(_workers(k8s)) - healthy
    k8s.clear_log()
    backend.scale(REF, 2, timeout=20)
    assert _patches(k8s)[0].body["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"] == sorted(pending)
    assert _names(_workers(k8s)) == healthy


def test_size_is_held_against_the_ray_autoscaler_and_restored(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 1, "minReplicas": 1, "maxReplicas": 6}],
                    autoscaling=True)
    k8s.set_hpa_window(0.3)
    # The emulated autoscaler acts: replicas set above minReplicas by someone else are pulled back.
    obj = k8s.get_resource(RAY, "r1")
    groups = obj["spec"]["workerGroupSpecs"]
    groups[0]["replicas"] = 3
    api_client = k8s.api_client()
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        "ray.io", "v1", "domino-compute", "rayclusters", "r1", {"spec": {"workerGroupSpecs": groups}}
    )
    api_client.close()
    k8s.wait_for(lambda: _group(k8s)["replicas"] == 1 and len(_workers(k8s)) == 1, 10, "the autoscaler to shrink it")
    backend.scale(REF, 4, timeout=20)
    time.sleep(0.8)
    assert _group(k8s)["replicas"] == 4 and len(_workers(k8s, ready=True)) == 4
    restored = backend.restore_baseline(REF, timeout=20)
    assert restored.effective == 1 and _group(k8s)["minReplicas"] == 1
    assert BASELINE_ANNOTATION not in (k8s.get_resource(RAY, "r1")["metadata"].get("annotations") or {})


def test_max_replicas_caps_and_strict_names_both(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 1, "maxReplicas": 3}])
    with pytest.raises(CapacityExceededError, match=r"5 workers requested but worker group 'workers' has maxReplicas 3"):
        backend.scale(REF, 5, strict=True, timeout=20)
    assert _patches(k8s) == []
    result = backend.scale(REF, 5, timeout=20)
    assert (result.effective, result.capped, result.final.ready_workers) == (3, True, 3)


def test_below_min_replicas_lowers_it_and_restore_puts_it_back(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 2, "minReplicas": 2}])
    assert backend.scale(REF, 0, timeout=20).final.existing_workers == 0
    assert _group(k8s)["minReplicas"] == 0 and _workers(k8s) == []
    backend.restore_baseline(REF, timeout=20)
    assert _group(k8s)["minReplicas"] == 2 and len(_workers(k8s, ready=True)) == 2


def test_a_group_is_chosen_by_name_and_a_wrong_one_lists_the_groups(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "cpu", "replicas": 1}, {"groupName": "gpu", "replicas": 1}])
    with pytest.raises(InvalidInputError, match="cpu, gpu") as caught:
        backend.scale(REF, 2, timeout=20)
    assert caught.value.field == "group" and "kuberay/r1@<group>" in str(caught.value)
    with pytest.raises(InvalidInputError, match="cpu, gpu"):
        backend.scale(ClusterRef("kuberay", "r1", group="tpu"), 2, timeout=20)
    assert _patches(k8s) == []
    gpu = parse_cluster("kuberay/r1@gpu")
    assert backend.scale(gpu, 3, timeout=20).final.ready_workers == 3
    assert len(_workers(k8s, "gpu", ready=True)) == 3 and len(_workers(k8s, "cpu")) == 1
    assert backend.get_state(gpu).desired_workers == 3
    assert backend.get_state(ClusterRef("kuberay", "r1", group="cpu")).existing_workers == 1
    # The records belong to the gpu group until it is restored.
    with pytest.raises(ConflictError, match="worker group 'gpu'"):
        backend.scale(ClusterRef("kuberay", "r1", group="cpu"), 2, timeout=20)
    backend.restore_baseline(gpu, timeout=20)
    assert _group(k8s, "gpu")["replicas"] == 1 and _group(k8s, "cpu")["replicas"] == 1


def test_claims_reconcile_to_the_largest_then_the_baseline(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 1, "maxReplicas": 8}], autoscaling=True)
    backend.claim(REF, "a", 2)
    backend.claim(REF, "b", 4)
    assert backend.reconcile(REF, timeout=20).effective == 4 and len(_workers(k8s, ready=True)) == 4
    backend.release(REF, "b")
    assert backend.reconcile(REF, timeout=20).effective == 2 and _group(k8s)["minReplicas"] == 2
    backend.release(REF, "a")
    assert backend.reconcile(REF, timeout=20).effective == 1
    notes = k8s.get_resource(RAY, "r1")["metadata"].get("annotations") or {}
    assert BASELINE_ANNOTATION not in notes and CLAIMS_ANNOTATION not in notes
    assert "minReplicas" not in _group(k8s) and len(_workers(k8s, ready=True)) == 1


@pytest.mark.parametrize("reason", ["Unschedulable", "CrashLoopBackOff"])
def test_a_worker_that_cannot_start_ends_the_wait_early(k8s, backend, reason):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 1}])
    k8s.inject_fault("r1", reason)
    with pytest.raises(WorkerFailedError) as caught:  # long before the 60 s timeout: the pod failed
        backend.scale(REF, 3, timeout=60)
    assert caught.value.reason == reason
    assert "restore" in str(caught.value)  # the change is left in place, and the error says how to undo it


def test_wait_times_out_naming_what_it_waited_for(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 1}])
    k8s.set_ready_delay(60, "r1")
    with pytest.raises(ScalingTimeoutError, match="2 Ready workers on domino-compute/kuberay/r1"):
        backend.scale(REF, 2, timeout=1)


def test_head_restart_deletes_the_head_pod_and_waits_for_a_new_one(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1")
    old = k8s.select_pods(**{"ray.io/cluster": "r1", "ray.io/node-type": "head"})[0]
    result = backend.restart_head(REF, timeout=20)
    assert result.pod == old["metadata"]["name"] and result.ready
    heads = k8s.select_pods(ready=True, **{"ray.io/cluster": "r1", "ray.io/node-type": "head"})
    assert len(heads) == 1 and heads[0]["metadata"]["uid"] != old["metadata"]["uid"]


def test_tiers_are_refused_before_any_request(k8s, backend):  # noqa: F811
    k8s.add_kuberay("r1")
    k8s.clear_log()
    with pytest.raises(InvalidInputError, match="choose the group instead") as caught:
        backend.scale(REF, 2, "small", timeout=20)
    assert caught.value.field == "worker_hw_tier"
    with pytest.raises(InvalidInputError) as head:
        backend.restart_head(REF, "small", timeout=20)
    assert head.value.field == "head_hw_tier"
    with pytest.raises(InvalidInputError):
        backend.restore_baseline(REF, target=ReplicaSpec(1, "small"), timeout=20)
    assert k8s.requests == []


def test_domino_ray_and_kuberay_clusters_of_one_name_stay_apart(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "r1", replicas=1)
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 1}])
    backend.scale(REF, 3, timeout=20)
    assert k8s.get_object("ray", "r1")["spec"]["worker"]["replicas"] == 1
    assert backend.get_state(ClusterRef("ray", "r1")).existing_workers == 1
    assert backend.get_state(REF).existing_workers == 3


def test_connection_env_points_at_the_head_service(backend):  # noqa: F811
    assert backend.connection_env(ClusterRef("kuberay", "r1", "ml")) == {
        "RAY_ADDRESS": "ray://r1-head-svc.ml.svc:10001",
        "RAY_HEAD_SERVICE_HOST": "r1-head-svc.ml.svc", "RAY_HEAD_SERVICE_PORT": "10001",
    }


def test_the_shipped_role_is_enough(k8s, backend):  # noqa: F811
    rules = role_rules(ROLE)
    assert rules == {(v, RAY) for v in ("get", "list", "watch", "patch")} | {
        (v, "pods") for v in ("get", "list", "watch", "delete")
    }
    k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 1, "maxReplicas": 4}], autoscaling=True)
    k8s.allow_only(rules)
    backend.scale(REF, 3, timeout=20)
    backend.claim(REF, "p", 2)
    backend.reconcile(REF, timeout=20)
    backend.restart_head(REF, timeout=20)
    backend.release(REF, "p")
    backend.restore_baseline(REF, timeout=20)
    assert k8s.requests and all(r.status != 403 for r in k8s.requests)
    k8s.forbid("patch", RAY)
    with pytest.raises(UnauthorizedError, match="cannot patch resource \"rayclusters\" in API group \"ray.io\""):
        backend.scale(REF, 2, timeout=20)


def test_other_backends_refuse_kuberay(tmp_path, monkeypatch):
    from flytekitplugins_ddlscale.backends import get_backend
    from flytekitplugins_ddlscale.errors import UnsupportedOperationError

    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path))
    for name in ("local", "scaler"):
        options = {"base_url": "http://127.0.0.1:9"} if name == "scaler" else {}
        with get_backend(name, **options) as other:
            with pytest.raises(UnsupportedOperationError, match="kuberay") as caught:
                other.scale(REF, 2)
            assert "scaler or" not in str(caught.value)
