"""Baselines and claims stored on the cluster object, conflicts, RBAC, ownership."""
import threading
from pathlib import Path

import pytest
import yaml
from tests.servers.k8s_fixtures import backend, k8s, make_backend, tiers_file  # noqa: F401 - fixtures

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.errors import ClusterNotFoundError, ConflictError, InvalidInputError, UnauthorizedError
from flytekitplugins_ddlscale.models import ReplicaSpec
from flytekitplugins_ddlscale._core.records import BASELINE_ANNOTATION, CLAIMS_ANNOTATION

RBAC = Path(__file__).resolve().parents[1] / "examples" / "k8s" / "rbac.yaml"
TIER_LABEL = "dominodatalab.com/hardware-tier-id"


def _annotations(server, kind, name):
    return server.get_object(kind, name)["metadata"].get("annotations") or {}


def test_baseline_restored_exactly_by_another_process(k8s, backend, tiers_file):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=2, autoscaling={"minReplicas": 2, "maxReplicas": 8},
                    worker_tier="small-k8s", head_tier="small-k8s")
    original = k8s.get_object("ray", "c1")["spec"]
    ref = ClusterRef("ray", "c1")
    backend.scale(ref, 5, "gpu", timeout=20)
    backend.restart_head(ref, "medium", timeout=20)
    backend.scale(ref, 6, timeout=20)  # a second change keeps the first baseline
    with make_backend(k8s, tiers_file) as other:
        baseline = other.get_baseline(ref)
        assert baseline is not None
        assert (baseline.replicas, baseline.autoscaling_min, baseline.autoscaling_max) == (2, 2, 8)
        assert (baseline.worker_hw_tier, baseline.head_hw_tier) == ("small-k8s", "small-k8s")
        result = other.restore_baseline(ref, timeout=20)
        assert result.final.ready_workers == 2 and result.final.worker_hw_tier == "small-k8s"
        assert other.get_baseline(ref) is None
    obj = k8s.get_object("ray", "c1")
    assert BASELINE_ANNOTATION not in (obj["metadata"].get("annotations") or {})
    for section in ("worker", "head", "autoscaling"):
        assert obj["spec"][section] == original[section], section
    assert all(p["metadata"]["labels"][TIER_LABEL] == "small-k8s" for p in k8s.pods("c1"))


def test_record_baseline_is_idempotent_and_restore_without_one_changes_nothing(k8s, backend):  # noqa: F811
    k8s.add_cluster("dask", "d1", replicas=3)
    ref = ClusterRef("dask", "d1")
    first = backend.record_baseline(ref)
    backend.scale(ref, 1, timeout=20)
    assert backend.record_baseline(ref).recorded_at == first.recorded_at
    backend.restore_baseline(ref, timeout=20)
    k8s.clear_log()
    result = backend.restore_baseline(ref, timeout=20)
    assert not result.waited and result.final.desired_workers == 3
    assert [r for r in k8s.requests if r.method == "PATCH"] == []


def test_restore_to_an_explicit_target(k8s, backend):  # noqa: F811
    k8s.add_cluster("spark", "s1", replicas=2, autoscaling={"minReplicas": 1, "maxReplicas": 4})
    ref = ClusterRef("spark", "s1")
    backend.scale(ref, 4, timeout=20)
    result = backend.restore_baseline(ref, ReplicaSpec(3, worker_hw_tier="medium"), timeout=20)
    assert result.final.ready_workers == 3 and result.final.worker_hw_tier == "medium-k8s"
    assert k8s.get_object("spark", "s1")["spec"]["autoscaling"]["minReplicas"] == 3
    k8s.clear_log()
    with pytest.raises(InvalidInputError, match="target.replicas"):
        backend.restore_baseline(ref, ReplicaSpec(-2))
    assert k8s.requests == []


def test_claims_from_concurrent_phases_are_never_lost(k8s, tiers_file):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1)
    ref = ClusterRef("ray", "c1")
    errors = []
    with make_backend(k8s, tiers_file, conflict_retries=50) as one, \
            make_backend(k8s, tiers_file, conflict_retries=50) as two:
        def claim(i):
            try:
                (one if i % 2 else two).claim(ref, f"phase-{i}", i + 1)
            except Exception as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert one.claim(ref, "phase-0", 1).replicas == 10
        assert one.release(ref, "phase-9").replicas == 9
        for i in range(9):
            two.release(ref, f"phase-{i}")
        assert two.release(ref, "phase-0") is None
    notes = _annotations(k8s, "ray", "c1")
    assert CLAIMS_ANNOTATION not in notes
    assert BASELINE_ANNOTATION in notes


def test_restore_drops_claims_left_by_killed_phases(k8s, backend):  # noqa: F811
    k8s.add_cluster("dask", "d1", replicas=1)
    ref = ClusterRef("dask", "d1")
    backend.claim(ref, "killed-phase", 4)
    backend.scale(ref, 4, timeout=20)
    result = backend.restore_baseline(ref, timeout=20)
    assert result.final.ready_workers == 1
    notes = _annotations(k8s, "dask", "d1")
    assert CLAIMS_ANNOTATION not in notes and BASELINE_ANNOTATION not in notes
    assert backend.claim(ref, "next-phase", 2).replicas == 2


def test_conflicts_are_reread_and_reapplied(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 5})
    k8s.interfere("ray", "c1", times=2)
    result = backend.scale(ClusterRef("ray", "c1"), 3, timeout=20)
    assert result.final.ready_workers == 3
    statuses = [r.status for r in k8s.requests if r.method == "PATCH"]
    assert statuses == [409, 409, 200]
    assert _annotations(k8s, "ray", "c1")["test.example.com/other-writer"] == "2"


def test_endless_conflicts_give_up_with_conflict_error(k8s, tiers_file):  # noqa: F811
    k8s.add_cluster("dask", "d1", replicas=1)
    k8s.interfere("dask", "d1", times=100)
    with make_backend(k8s, tiers_file, conflict_retries=3) as impatient:
        with pytest.raises(ConflictError, match="3 attempts"):
            impatient.scale(ClusterRef("dask", "d1"), 2, timeout=20)
    assert k8s.get_object("dask", "d1")["spec"]["worker"]["replicas"] == 1
    assert [r.status for r in k8s.requests if r.method == "PATCH"] == [409, 409, 409]


@pytest.mark.parametrize("verb, resource", [("patch", "rayclusters"), ("watch", "pods"), ("get", "rayclusters")])
def test_rbac_refusal_names_verb_and_resource(k8s, backend, verb, resource):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1)
    k8s.set_ready_delay(0.5)  # so the wait has to watch
    k8s.forbid(verb, resource)
    with pytest.raises(UnauthorizedError) as err:
        backend.scale(ClusterRef("ray", "c1"), 2, timeout=20)
    message = str(err.value)
    assert f"refused to {verb} {resource}" in message and err.value.status_code == 403


def test_head_delete_refused_by_rbac(k8s, backend):  # noqa: F811
    k8s.add_cluster("spark", "s1", replicas=1)
    k8s.forbid("delete", "pods")
    with pytest.raises(UnauthorizedError, match="refused to delete pods 's1-spark-master-0'"):
        backend.restart_head(ClusterRef("spark", "s1"), timeout=20)


def test_shipped_role_is_enough_and_exact(k8s, backend):  # noqa: F811
    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "Role")
    rules = {(verb, resource) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}
    crds = {"rayclusters", "sparkclusters", "daskclusters", "mpiclusters"}
    assert rules == {(v, r) for r in crds for v in ("get", "list", "watch", "patch")} | {
        (v, "pods") for v in ("get", "list", "watch", "delete")
    }
    for kind in ("ray", "mpi"):
        k8s.add_cluster(kind, "c1", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 3} if kind == "ray" else None)
    k8s.allow_only(rules)
    ref = ClusterRef("ray", "c1")
    backend.scale(ref, 0, timeout=20)
    backend.claim(ref, "p", 2)
    backend.scale(ref, 2, "small", timeout=20)
    backend.restart_head(ref, timeout=20)
    backend.restart_head(ref, "medium", timeout=20)
    backend.release(ref, "p")
    backend.restore_baseline(ref, timeout=20)
    backend.scale(ClusterRef("mpi", "c1"), 2, timeout=20)
    assert all(r.status != 403 for r in k8s.requests)


def test_missing_cluster_is_not_found(k8s, backend):  # noqa: F811
    with pytest.raises(ClusterNotFoundError, match="rayclusters 'ghost'"):
        backend.scale(ClusterRef("ray", "ghost"), 1)
    with pytest.raises(ClusterNotFoundError):
        backend.get_state(ClusterRef("dask", "ghost", namespace="elsewhere"))


def test_foreign_clusters_are_refused_unless_allowed(k8s, tiers_file, monkeypatch):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1, owner="alice")
    monkeypatch.setenv("DOMINO_STARTING_USER_ID", "bob")
    with make_backend(k8s, tiers_file) as bobs:
        assert bobs.get_state(ClusterRef("ray", "c1")).ready_workers == 1
        with pytest.raises(UnauthorizedError, match="alice"):
            bobs.scale(ClusterRef("ray", "c1"), 2)
        with pytest.raises(UnauthorizedError):
            bobs.claim(ClusterRef("ray", "c1"), "x", 2)
    assert [r for r in k8s.requests if r.method == "PATCH"] == []
    with make_backend(k8s, tiers_file, allow_foreign=True) as anyone:
        assert anyone.scale(ClusterRef("ray", "c1"), 2, timeout=20).final.ready_workers == 2
    with make_backend(k8s, tiers_file, owner="alice") as alices:
        assert alices.scale(ClusterRef("ray", "c1"), 1, timeout=20).final.ready_workers == 1


def test_autoscaling_removed_for_zero_workers_is_parked_until_the_next_scale_up(k8s, backend):  # noqa: F811
    from flytekitplugins_ddlscale.backends.kubernetes._resources.dco import PARKED_AUTOSCALING_ANNOTATION

    k8s.add_cluster("ray", "zero", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 6})
    ref = ClusterRef("ray", "zero")
    backend.claim(ref, "p", 3)
    backend.reconcile(ref, timeout=20)
    backend.release(ref, "p")
    backend.reconcile(ref, ReplicaSpec(0), timeout=20)
    obj = k8s.get_object("ray", "zero")
    assert obj["spec"]["worker"]["replicas"] == 0 and "autoscaling" not in obj["spec"]
    assert BASELINE_ANNOTATION not in _annotations(k8s, "ray", "zero")
    assert PARKED_AUTOSCALING_ANNOTATION in _annotations(k8s, "ray", "zero")
    assert backend.scale(ref, 9, timeout=20).effective == 6  # the parked maxReplicas still caps
    assert k8s.get_object("ray", "zero")["spec"]["autoscaling"] == {"minReplicas": 6, "maxReplicas": 6}
    assert PARKED_AUTOSCALING_ANNOTATION not in _annotations(k8s, "ray", "zero")
    backend.restore_baseline(ref, timeout=20)  # back to the 0-worker baseline: parked again
    assert "autoscaling" not in k8s.get_object("ray", "zero")["spec"]
    backend.scale(ref, 2, timeout=20)
    assert k8s.get_object("ray", "zero")["spec"]["autoscaling"] == {"minReplicas": 2, "maxReplicas": 6}


@pytest.mark.parametrize(
    "annotation, text, field",
    [
        ("parked", '{"maxReplicas": -3}', "autoscaling.maxReplicas"),
        ("parked", '{"maxReplicas": 6, "minReplicas": "all"}', "autoscaling.minReplicas"),
        ("parked", '{"maxReplicas": 6, "surprise": 1}', "autoscaling.surprise"),
        ("parked", "not json", "autoscaling"),
        ("claims", '{"bad id\\n": {"claim_id": "bad id\\n", "replicas": 2}}', "claims"),
        ("claims", '{"p": {"claim_id": "p", "replicas": 2, "holder": "no pid"}}', "claims['p'].holder"),
        ("claims", '{"p": {"claim_id": "p", "replicas": 2, "lease_seconds": -1}}', "claims['p'].lease_seconds"),
        ("outside", '{"cluster": "ray/x", "replicas": 2, "recorded_at": "2026-01-01T00:00:00+00:00", '
                    '"kubernetes": {"autoscaling": {"maxReplicas": 0}}}', "kubernetes.autoscaling.maxReplicas"),
    ],
)
def test_corrupt_record_annotations_are_refused_before_anything_changes(k8s, backend, annotation, text, field):  # noqa: F811
    from flytekitplugins_ddlscale.backends.kubernetes._resources.dco import PARKED_AUTOSCALING_ANNOTATION
    from flytekitplugins_ddlscale.errors import CorruptRecordError
    from flytekitplugins_ddlscale._core.records import OUTSIDE_ANNOTATION

    names = {"parked": PARKED_AUTOSCALING_ANNOTATION, "claims": CLAIMS_ANNOTATION, "outside": OUTSIDE_ANNOTATION}
    k8s.add_cluster("ray", "bad", replicas=0)
    rays = backend._resource(ClusterRef("ray", "bad"))
    backend.api.patch_object(rays, "domino-compute", "bad", {"metadata": {"annotations": {names[annotation]: text}}})
    before = k8s.get_object("ray", "bad")["spec"]
    with pytest.raises(CorruptRecordError) as caught:
        backend.claim(ClusterRef("ray", "bad"), "p2", 2)
        backend.reconcile(ClusterRef("ray", "bad"), timeout=20)
    assert caught.value.field == field and names[annotation] in str(caught.value)
    assert k8s.get_object("ray", "bad")["spec"] == before
