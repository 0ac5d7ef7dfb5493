"""KubernetesBackend scaling, tiers and head restarts against the protocol-true test server."""
import json
import logging
import subprocess
import sys

import pytest
from tests.servers.k8s_fixtures import backend, k8s, tiers_file  # noqa: F401 - fixtures

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends import ClusterBackend, get_backend
from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
from flytekitplugins_ddlscale.errors import (
    CapacityExceededError,
    InvalidInputError,
    NeverReachedError,
    UnknownTierError,
    UnsupportedOperationError,
)
from flytekitplugins_ddlscale._core.records import BASELINE_ANNOTATION
from flytekitplugins_ddlscale._core.redaction import redact

AUTO = {"minReplicas": 1, "maxReplicas": 5}
TIER_LABEL = "dominodatalab.com/hardware-tier-id"


def _patches(server):
    return [r for r in server.requests if r.method == "PATCH"]


def test_capabilities_and_protocol():
    instance = KubernetesBackend()
    assert isinstance(instance, ClusterBackend)
    caps = instance.capabilities
    assert caps.kinds == frozenset({"ray", "spark", "dask", "mpi", "kuberay", "dask-operator"})
    assert caps.observes_readiness and caps.holds_size and caps.head_tier and caps.persistent_baseline
    assert isinstance(get_backend("k8s", namespace="team-a"), KubernetesBackend)


def test_kubernetes_client_is_imported_lazily():
    code = (
        "import sys; from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend; "
        "KubernetesBackend(); print('kubernetes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_kubeconfig_token_is_registered_as_secret(tmp_path):
    token = "kube-token-s3cr3t-value"
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    instance = KubernetesBackend(kubeconfig=str(path), request_timeout=2)
    with pytest.raises(NeverReachedError) as err:
        instance.get_state(ClusterRef("ray", "c1"))
    instance.close()
    assert token not in str(err.value)
    assert token not in redact(f"request failed with token {token}")


def test_kubeconfig_from_environment_is_read_when_the_client_is_made(k8s, tmp_path, monkeypatch):  # noqa: F811
    k8s.add_cluster("spark", "s1", replicas=1)
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "k", "cluster": {"server": k8s.url}}],
        "users": [{"name": "u", "user": {"token": "test-token-1234"}}],
        "contexts": [{"name": "test", "context": {"cluster": "k", "user": "u"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    instance = KubernetesBackend()
    try:
        assert instance.get_state(ClusterRef("spark", "s1")).ready_workers == 1
    finally:
        instance.close()


@pytest.mark.parametrize("kind", ["ray", "spark", "dask"])
def test_scale_up_holds_size_with_one_merge_patch(k8s, backend, kind):  # noqa: F811
    k8s.add_cluster(kind, "c1", replicas=2, autoscaling=AUTO)
    k8s.clear_log()
    result = backend.scale(ClusterRef(kind, "c1"), 4, timeout=20)
    assert (result.requested, result.effective, result.capped) == (4, 4, False)
    assert result.previous.desired_workers == 2 and result.previous.ready_workers == 2
    assert result.final.ready_workers == 4 and result.final.desired_workers == 4
    assert k8s.ready_workers("c1", kind=kind) == 4
    patches = _patches(k8s)
    assert len(patches) == 1
    assert patches[0].content_type == "application/merge-patch+json"
    assert patches[0].body["spec"] == {"worker": {"replicas": 4}, "autoscaling": {"minReplicas": 4}}
    assert patches[0].body["metadata"]["resourceVersion"]
    obj = k8s.get_object(kind, "c1")
    assert obj["spec"]["autoscaling"] == {"minReplicas": 4, "maxReplicas": 5}
    assert BASELINE_ANNOTATION in obj["metadata"]["annotations"]


def test_scale_down_waits_for_pods_to_go(k8s, backend):  # noqa: F811
    k8s.add_cluster("dask", "d1", replicas=4)
    result = backend.scale(ClusterRef("dask", "d1"), 1, timeout=20)
    assert result.final.existing_workers == 1 and result.final.ready_workers == 1
    assert len(k8s.pods("d1", component="worker")) == 1
    assert "autoscaling" not in k8s.get_object("dask", "d1")["spec"]


def test_mpi_scales_without_autoscaling_and_has_no_head(k8s, backend):  # noqa: F811
    k8s.add_cluster("mpi", "m1", replicas=2)
    ref = ClusterRef("mpi", "m1")
    result = backend.scale(ref, 3, timeout=20)
    assert result.final.ready_workers == 3 and result.final.head_ready is None
    assert _patches(k8s)[0].body["spec"] == {"worker": {"replicas": 3}}
    k8s.clear_log()
    with pytest.raises(UnsupportedOperationError):
        backend.restart_head(ref)
    assert k8s.requests == []


def test_cap_at_max_replicas(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=2, autoscaling=AUTO)
    result = backend.scale(ClusterRef("ray", "c1"), 9, timeout=20)
    assert (result.requested, result.effective, result.capped) == (9, 5, True)
    assert result.final.ready_workers == 5
    assert k8s.get_object("ray", "c1")["spec"]["autoscaling"]["minReplicas"] == 5


def test_strict_refuses_before_patching(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=2, autoscaling=AUTO)
    before = k8s.get_object("ray", "c1")
    with pytest.raises(CapacityExceededError) as err:
        backend.scale(ClusterRef("ray", "c1"), 6, strict=True, timeout=20)
    assert "maxReplicas is 5" in str(err.value)
    assert _patches(k8s) == []
    assert k8s.get_object("ray", "c1") == before


def test_zero_scale_removes_autoscaling_and_restore_puts_it_back(k8s, backend):  # noqa: F811
    auto = {"minReplicas": 2, "maxReplicas": 6, "averageCPUUtilization": 70, "scaleDownStabilizationWindowSeconds": 120}
    k8s.add_cluster("spark", "s1", replicas=3, autoscaling=auto)
    ref = ClusterRef("spark", "s1")
    result = backend.scale(ref, 0, timeout=20)
    assert result.final.ready_workers == 0 and result.final.autoscaling_max is None
    spec = k8s.get_object("spark", "s1")["spec"]
    assert "autoscaling" not in spec and spec["worker"]["replicas"] == 0
    # Scaling up again from zero brings autoscaling back, holding the new size.
    backend.scale(ref, 4, timeout=20)
    assert k8s.get_object("spark", "s1")["spec"]["autoscaling"] == dict(auto, minReplicas=4)
    backend.scale(ref, 0, timeout=20)
    restored = backend.restore_baseline(ref, timeout=20)
    assert restored.final.ready_workers == 3
    obj = k8s.get_object("spark", "s1")
    assert obj["spec"]["autoscaling"] == auto
    assert BASELINE_ANNOTATION not in (obj["metadata"].get("annotations") or {})


def test_worker_tier_change_rides_in_the_same_patch(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=2, autoscaling=AUTO, worker_tier="small-k8s")
    k8s.clear_log()
    result = backend.scale(ClusterRef("ray", "c1"), 3, "gpu", timeout=20)
    assert result.worker_hw_tier == "gpu" and result.final.worker_hw_tier == "gpu-k8s"
    patches = _patches(k8s)
    assert len(patches) == 1
    worker = patches[0].body["spec"]["worker"]
    assert worker["replicas"] == 3
    assert worker["resources"]["requests"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    assert worker["nodeSelector"] == {"dominodatalab.com/node-pool": "gpu-pool"}
    assert worker["labels"] == {TIER_LABEL: "gpu-k8s"}
    pods = k8s.pods("c1", component="worker")
    assert len(pods) == 3
    assert all(p["metadata"]["labels"][TIER_LABEL] == "gpu-k8s" for p in pods)
    assert all(p["spec"]["nodeSelector"] == {"dominodatalab.com/node-pool": "gpu-pool"} for p in pods)
    # Back to a tier without GPU: the GPU request is removed, not left behind.
    backend.scale(ClusterRef("ray", "c1"), 3, "medium", timeout=20)
    resources = k8s.get_object("ray", "c1")["spec"]["worker"]["resources"]
    assert resources["requests"] == {"cpu": "2", "memory": "8Gi"}
    assert k8s.get_object("ray", "c1")["spec"]["worker"]["nodeSelector"] == {"dominodatalab.com/node-pool": "default"}


@pytest.mark.parametrize(
    "args, error",
    [
        ((-1,), InvalidInputError),
        (("3",), InvalidInputError),
        ((True,), InvalidInputError),
        ((1001,), InvalidInputError),
        ((2, ""), InvalidInputError),
        ((2, "huge"), UnknownTierError),
        ((2, "spark-only"), UnknownTierError),
    ],
)
def test_bad_input_is_refused_before_any_request(k8s, backend, args, error):  # noqa: F811
    k8s.add_cluster("ray", "c1")
    k8s.clear_log()
    with pytest.raises(error) as err:
        backend.scale(ClusterRef("ray", "c1"), *args)
    assert k8s.requests == []
    if error is UnknownTierError:
        assert "small" in str(err.value) and "worker_hw_tier" in str(err.value)


@pytest.mark.parametrize("kwargs", [{"timeout": 0}, {"timeout": float("nan")}, {"timeout": "10"}])
def test_bad_timeout_is_refused_before_any_request(k8s, backend, kwargs):  # noqa: F811
    k8s.add_cluster("ray", "c1")
    k8s.clear_log()
    with pytest.raises(InvalidInputError, match="timeout"):
        backend.scale(ClusterRef("ray", "c1"), 2, **kwargs)
    with pytest.raises(InvalidInputError, match="timeout"):
        backend.restart_head(ClusterRef("ray", "c1"), **kwargs)
    assert k8s.requests == []


def test_tier_without_catalog_names_the_ways_to_configure_one(k8s, monkeypatch):  # noqa: F811
    monkeypatch.delenv("DOMINO_API_PROXY", raising=False)
    monkeypatch.delenv("DDLSCALE_TIERS_FILE", raising=False)
    k8s.add_cluster("ray", "c1")
    client = k8s.api_client()
    instance = KubernetesBackend(api_client=client)
    k8s.clear_log()
    with pytest.raises(InvalidInputError, match="DDLSCALE_TIERS_FILE"):
        instance.scale(ClusterRef("ray", "c1"), 2, "small")
    assert k8s.requests == []
    client.close()


def test_tiers_file_from_environment(k8s, tiers_file, monkeypatch):  # noqa: F811
    monkeypatch.delenv("DOMINO_API_PROXY", raising=False)
    monkeypatch.setenv("DDLSCALE_TIERS_FILE", str(tiers_file))
    k8s.add_cluster("dask", "d1", replicas=1)
    client = k8s.api_client()
    instance = KubernetesBackend(api_client=client, failure_grace=0.3)
    result = instance.scale(ClusterRef("dask", "d1"), 1, "medium", timeout=20)
    assert result.final.worker_hw_tier == "medium-k8s"
    client.close()


@pytest.mark.parametrize("kind, component", [("ray", "head"), ("spark", "master"), ("dask", "scheduler")])
def test_restart_head_without_tier_replaces_the_pod(k8s, backend, kind, component):  # noqa: F811
    k8s.add_cluster(kind, "c1", replicas=1)
    old = k8s.pods("c1", component=component)[0]
    result = backend.restart_head(ClusterRef(kind, "c1"), timeout=20)
    assert result.pod == old["metadata"]["name"] and result.ready and result.final.head_ready
    new = k8s.pods("c1", component=component)[0]
    assert new["metadata"]["name"] == old["metadata"]["name"]
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["metadata"]["creationTimestamp"] > old["metadata"]["creationTimestamp"]
    deletes = [r for r in k8s.requests if r.method == "DELETE"]
    assert len(deletes) == 1 and deletes[0].body["preconditions"]["uid"] == old["metadata"]["uid"]
    assert _patches(k8s) == []


def test_restart_head_on_a_new_tier_patches_the_head_section(k8s, backend):  # noqa: F811
    k8s.add_cluster("spark", "s1", replicas=1, head_tier="small-k8s")
    old = k8s.pods("s1", component="master")[0]
    k8s.clear_log()
    result = backend.restart_head(ClusterRef("spark", "s1"), "medium", timeout=20)
    assert result.head_hw_tier == "medium" and result.final.head_hw_tier == "medium-k8s"
    patch = _patches(k8s)[0].body
    assert patch["spec"]["master"]["labels"] == {TIER_LABEL: "medium-k8s"}
    assert patch["spec"]["master"]["resources"]["requests"] == {"cpu": "2", "memory": "8Gi"}
    assert [r for r in k8s.requests if r.method == "DELETE"] == []
    new = k8s.pods("s1", component="master")[0]
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["metadata"]["labels"][TIER_LABEL] == "medium-k8s"
    baseline = backend.get_baseline(ClusterRef("spark", "s1"))
    assert baseline is not None and baseline.head_hw_tier == "small-k8s"


def test_restart_head_on_its_current_tier_deletes_the_pod(k8s, backend):  # noqa: F811
    medium = {"cpu": "2", "memory": "8Gi"}
    k8s.add_cluster("ray", "c1", replicas=1, head_resources={"requests": medium, "limits": medium})
    backend.restart_head(ClusterRef("ray", "c1"), "medium", timeout=20)
    old = k8s.pods("c1", component="head")[0]
    k8s.clear_log()
    result = backend.restart_head(ClusterRef("ray", "c1"), "medium", timeout=20)
    assert result.ready and _patches(k8s) == []
    assert len([r for r in k8s.requests if r.method == "DELETE"]) == 1
    assert k8s.pods("c1", component="head")[0]["metadata"]["uid"] != old["metadata"]["uid"]


def test_restart_head_restricted_tier_is_refused_first(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1)
    k8s.clear_log()
    with pytest.raises(UnknownTierError, match="head_hw_tier"):
        backend.restart_head(ClusterRef("ray", "c1"), "spark-only")
    assert k8s.requests == []


def test_scale_without_wait_returns_after_the_patch(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1)
    k8s.set_ready_delay(30)
    result = backend.scale(ClusterRef("ray", "c1"), 3, wait=False)
    assert not result.waited and result.final.desired_workers == 3
    assert result.final.ready_workers == 1


def test_a_restore_whose_answer_was_lost_reports_what_it_applied(k8s, backend, caplog):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1)
    ref = ClusterRef("ray", "c1")
    backend.scale(ref, 3, timeout=20)
    backend.claim(ref, "left-by-a-killed-process", 3)
    k8s.clear_log()
    k8s.lose_answers("PATCH")
    with caplog.at_level(logging.WARNING, logger="flytekitplugins_ddlscale.kubernetes"):
        restored = backend.restore_baseline(ref, timeout=20)
    assert "restore dropped claims left-by-a-killed-process" in caplog.text
    # Applied once, its answer lost, the re-read showed it applied: nothing sent again.
    assert [r.status for r in _patches(k8s)] == [200]
    assert k8s.get_object("ray", "c1")["spec"]["worker"]["replicas"] == 1
    assert (restored.effective, restored.waited, restored.final.ready_workers) == (1, True, 1)
    assert restored.previous.desired_workers == 3 and restored.final.desired_workers == 1
    assert BASELINE_ANNOTATION not in (k8s.get_object("ray", "c1")["metadata"].get("annotations") or {})


def test_a_reconcile_restoring_whose_answer_was_lost_reports_what_it_applied(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1)
    ref = ClusterRef("ray", "c1")
    backend.claim(ref, "p", 3)
    assert backend.reconcile(ref, timeout=20).effective == 3
    backend.release(ref, "p")
    k8s.clear_log()
    k8s.lose_answers("PATCH")
    restored = backend.reconcile(ref, timeout=20)
    assert [r.status for r in _patches(k8s)] == [200]
    assert restored is not None and (restored.effective, restored.final.ready_workers) == (1, 1)
    assert BASELINE_ANNOTATION not in (k8s.get_object("ray", "c1")["metadata"].get("annotations") or {})

