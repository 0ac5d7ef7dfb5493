"""Dask-operator clusters (kind ``dask-operator``) on the Kubernetes backend, against the test
server's DaskCluster/DaskWorkerGroup/DaskAutoscaler CRD facts and simulated Dask operator."""
import json
import re
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.contract_support import write_kubeconfig
from tests.servers.k8s_fixtures import backend, k8s, role_rules, tiers_file  # noqa: F401 - fixtures

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.cli import main
from flytekitplugins_ddlscale.errors import (
    CapacityExceededError,
    ClusterNotFoundError,
    InvalidInputError,
    ScalingTimeoutError,
    UnauthorizedError,
    UnsupportedOperationError,
    WorkerFailedError,
)
from flytekitplugins_ddlscale._core.records import BASELINE_ANNOTATION, CLAIMS_ANNOTATION
from flytekitplugins_ddlscale.refs import parse_cluster

GROUPS = "daskworkergroups.kubernetes.dask.org"
AUTOSCALERS = "daskautoscalers.kubernetes.dask.org"
HELD = "ddlscale.flyte.org/autoscaler-minimum"
ROLE = Path(__file__).resolve().parents[1] / "examples" / "k8s" / "dask-operator-rbac.yaml"
REF = ClusterRef("dask-operator", "d1")


def _workers(server, group="d1-default", ready=None):
    return server.select_pods(ready=ready, **{"dask.org/cluster-name": "d1", "dask.org/component": "worker",
                                              "dask.org/workergroup-name": group})


def _replicas(server, group="d1-default"):
    return server.get_resource(GROUPS, group)["spec"]["worker"]["replicas"]


def _patches(server):
    return [r for r in server.requests if r.method == "PATCH"]


def _autoscaler(server):
    scaler = server.get_resource(AUTOSCALERS, "d1")
    return scaler["spec"]["minimum"], (scaler["metadata"].get("annotations") or {}).get(HELD)


def _baseline_recorded(server):
    return BASELINE_ANNOTATION in (server.get_resource(GROUPS, "d1-default")["metadata"].get("annotations") or {})


def test_scale_patches_the_default_worker_group_and_restores(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1)
    result = backend.scale(REF, 3, timeout=20)
    assert result.final.ready_workers == 3 and _replicas(k8s) == 3 and len(_workers(k8s, ready=True)) == 3
    patch = _patches(k8s)[-1]
    assert patch.path == "/apis/kubernetes.dask.org/v1/namespaces/domino-compute/daskworkergroups/d1-default"
    assert patch.content_type.startswith("application/merge-patch+json")
    assert backend.get_baseline(REF).replicas == 1
    assert backend.scale(REF, 0, timeout=20).final.existing_workers == 0 and _workers(k8s) == []
    restored = backend.restore_baseline(REF, timeout=20)
    assert restored.effective == 1 and len(_workers(k8s, ready=True)) == 1
    assert BASELINE_ANNOTATION not in (k8s.get_resource(GROUPS, "d1-default")["metadata"].get("annotations") or {})


def test_a_named_group_is_scaled_and_a_wrong_one_lists_the_groups(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1, groups={"highmem": 1})
    highmem = parse_cluster("dask-operator/d1@highmem")
    assert backend.scale(highmem, 2, timeout=20).final.ready_workers == 2
    assert _replicas(k8s, "d1-highmem") == 2 and _replicas(k8s) == 1 and len(_workers(k8s)) == 1
    with pytest.raises(InvalidInputError, match="default, highmem") as caught:
        backend.scale(ClusterRef("dask-operator", "d1", group="gpu"), 2, timeout=20)
    assert caught.value.field == "group"


def test_a_size_is_held_against_a_dask_autoscaler_that_wants_fewer(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1, autoscaler={"minimum": 1, "maximum": 5})
    k8s.set_hpa_window(0.1)
    result = backend.scale(REF, 3, timeout=20)
    assert result.effective == 3 and not result.capped and result.final.ready_workers == 3
    assert _autoscaler(k8s) == (3, "1") and backend.get_baseline(REF).replicas == 1
    # The autoscaler still acts (it follows a scheduler that wants more) ...
    k8s.set_dask_desired("d1", 4)
    k8s.wait_for(lambda: _replicas(k8s) == 4, 10, "the autoscaler to grow the group")
    # ... and when the scheduler wants none, it stops at the held size, not at its own minimum.
    k8s.set_dask_desired("d1", 0)
    k8s.wait_for(lambda: _replicas(k8s) == 3 and len(_workers(k8s)) == 3, 10, "the autoscaler to come down to 3")
    time.sleep(0.5)  # several adapt cycles: it stays there
    assert _replicas(k8s) == 3 and len(_workers(k8s)) == 3
    restored = backend.restore_baseline(REF, timeout=20)
    assert restored.effective == 1 and _autoscaler(k8s) == (1, None) and not _baseline_recorded(k8s)
    k8s.wait_for(lambda: _replicas(k8s) == 1 and len(_workers(k8s)) == 1, 10, "the group back at 1")


def test_the_state_shows_the_autoscaler_bounds(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1, autoscaler={"minimum": 1, "maximum": 5})
    state = backend.get_state(REF)
    assert (state.autoscaling_min, state.autoscaling_max, state.autoscaling) == (1, 5, True)
    backend.scale(REF, 3, timeout=20)
    assert (backend.get_state(REF).autoscaling_min, backend.get_state(REF).autoscaling_max) == (3, 5)
    named = backend.get_state(ClusterRef("dask-operator", "d1", group="default"))
    assert (named.autoscaling_min, named.autoscaling_max) == (3, 5)
    k8s.add_dask_operator("d2", replicas=1)
    alone = backend.get_state(ClusterRef("dask-operator", "d2"))
    assert (alone.autoscaling_min, alone.autoscaling_max, alone.autoscaling) == (None, None, False)


def test_cli_status_shows_the_autoscaler_bounds(k8s, tmp_path):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1, autoscaler={"minimum": 1, "maximum": 5})
    environment = {"DDLSCALE_BACKEND": "kubernetes", "DDLSCALE_STATE_DIR": str(tmp_path / "state"),
                   "KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", k8s.url))}
    result = CliRunner().invoke(main, ["status", "--kind", "dask-operator", "--name", "d1", "--json"],
                                env=environment, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    state = json.loads(result.stdout)
    assert (state["desired_workers"], state["autoscaling_min"], state["autoscaling_max"]) == (1, 1, 5)


def test_above_the_autoscaler_maximum_is_capped_or_refused_in_strict_mode(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1, autoscaler={"minimum": 1, "maximum": 3})
    k8s.clear_log()
    with pytest.raises(CapacityExceededError, match="5 workers requested but DaskAutoscaler 'd1' has maximum 3"):
        backend.scale(REF, 5, strict=True, timeout=20)
    assert _patches(k8s) == [] and _replicas(k8s) == 1 and _autoscaler(k8s) == (1, None)
    result = backend.scale(REF, 5, timeout=20)
    assert (result.effective, result.capped, _replicas(k8s), _autoscaler(k8s)) == (3, True, 3, (3, "1"))
    backend.restore_baseline(REF, timeout=20)
    assert _autoscaler(k8s) == (1, None) and _replicas(k8s) == 1


def test_the_autoscaler_patch_refused_leaves_a_group_the_autoscaler_can_only_shrink(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1, autoscaler={"minimum": 1, "maximum": 5})
    k8s.forbid("patch", AUTOSCALERS)
    with pytest.raises(UnauthorizedError, match="daskautoscalers"):
        backend.scale(REF, 3, timeout=20)
    # As documented: the worker group (with its baseline) was patched first; the autoscaler
    # kept its own minimum and so pulls the group back, never above what was asked.
    assert _autoscaler(k8s) == (1, None) and _baseline_recorded(k8s)
    k8s.set_hpa_window(0.05)
    k8s.wait_for(lambda: _replicas(k8s) == 1, 10, "the autoscaler to shrink the group")
    assert backend.restore_baseline(REF, timeout=20).effective == 1 and not _baseline_recorded(k8s)


def test_a_restore_stopped_half_way_is_finished_by_repeating_it(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1, autoscaler={"minimum": 1, "maximum": 5})
    backend.scale(REF, 3, timeout=20)
    k8s.forbid("patch", GROUPS)
    with pytest.raises(UnauthorizedError, match="daskworkergroups"):
        backend.restore_baseline(REF, timeout=20)
    # The autoscaler went back first; the worker group still carries the record.
    assert _autoscaler(k8s) == (1, None) and _baseline_recorded(k8s) and _replicas(k8s) == 3
    k8s.allow_all()
    assert backend.restore_baseline(REF, timeout=20).effective == 1
    assert _autoscaler(k8s) == (1, None) and not _baseline_recorded(k8s) and _replicas(k8s) == 1
    assert backend.restore_baseline(REF, timeout=20).effective == 1 and _autoscaler(k8s) == (1, None)


def test_claims_hold_the_largest_against_the_autoscaler(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1, autoscaler={"minimum": 1, "maximum": 5})
    backend.claim(REF, "a", 4)
    backend.claim(REF, "b", 2)
    assert backend.reconcile(REF, timeout=20).effective == 4 and _autoscaler(k8s) == (4, "1")
    backend.release(REF, "a")
    assert backend.reconcile(REF, timeout=20).effective == 2 and _autoscaler(k8s) == (2, "1")
    assert len(_workers(k8s, ready=True)) == 2
    backend.release(REF, "b")
    assert backend.reconcile(REF, timeout=20).effective == 1
    assert _autoscaler(k8s) == (1, None) and not _baseline_recorded(k8s)


def test_a_named_group_is_not_held_against_the_autoscaler(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1, groups={"highmem": 1}, autoscaler={"minimum": 1, "maximum": 2})
    assert backend.scale(parse_cluster("dask-operator/d1@highmem"), 4, timeout=20).effective == 4
    assert _autoscaler(k8s) == (1, None) and _replicas(k8s, "d1-highmem") == 4


def test_the_emulated_autoscaler_really_acts(k8s):  # noqa: F811
    """The control of the hold above: without it, the autoscaler pulls the group back to its minimum."""
    k8s.add_dask_operator("d1", replicas=1, autoscaler={"minimum": 1, "maximum": 5})
    k8s.set_hpa_window(0.2)
    from kubernetes import client

    api_client = k8s.api_client()
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        "kubernetes.dask.org", "v1", "domino-compute", "daskworkergroups", "d1-default",
        {"spec": {"worker": {"replicas": 3}}},
    )
    api_client.close()
    k8s.wait_for(lambda: _replicas(k8s) == 1 and len(_workers(k8s)) == 1, 10, "the autoscaler to shrink it")


def test_claims_reconcile_to_the_largest_then_the_baseline(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1)
    backend.claim(REF, "a", 3)
    backend.claim(REF, "b", 2)
    assert backend.reconcile(REF, timeout=20).effective == 3
    backend.release(REF, "a")
    assert backend.reconcile(REF, timeout=20).effective == 2 and len(_workers(k8s, ready=True)) == 2
    backend.release(REF, "b")
    assert backend.reconcile(REF, timeout=20).effective == 1
    notes = k8s.get_resource(GROUPS, "d1-default")["metadata"].get("annotations") or {}
    assert BASELINE_ANNOTATION not in notes and CLAIMS_ANNOTATION not in notes


@pytest.mark.parametrize("reason", ["CrashLoopBackOff", "Unschedulable"])
def test_a_worker_that_cannot_start_ends_the_wait_early(k8s, backend, reason):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1)
    k8s.inject_fault("d1", reason)
    with pytest.raises(WorkerFailedError) as caught:  # long before the 60 s timeout: the pod failed
        backend.scale(REF, 3, timeout=60)
    assert caught.value.reason == reason


def test_scheduler_restart_waits_for_a_new_scheduler(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1)
    old = k8s.select_pods(**{"dask.org/cluster-name": "d1", "dask.org/component": "scheduler"})[0]
    result = backend.restart_head(REF, timeout=20)
    assert result.pod == old["metadata"]["name"] and result.ready
    new = k8s.select_pods(ready=True, **{"dask.org/cluster-name": "d1", "dask.org/component": "scheduler"})
    assert len(new) == 1 and new[0]["metadata"]["uid"] != old["metadata"]["uid"]


def test_tiers_are_refused_and_connection_env_names_the_scheduler_service(k8s, backend):  # noqa: F811
    with pytest.raises(InvalidInputError) as caught:
        backend.scale(REF, 2, "small")
    assert caught.value.field == "worker_hw_tier" and k8s.requests == []
    assert backend.connection_env(ClusterRef("dask-operator", "d1", "team")) == {
        "DASK_SCHEDULER_SERVICE_HOST": "d1-scheduler.team.svc", "DASK_SCHEDULER_SERVICE_PORT": "8786",
    }


def test_the_shipped_role_is_enough(k8s, backend):  # noqa: F811
    rules = role_rules(ROLE)
    assert rules == {(v, GROUPS) for v in ("get", "list", "watch", "patch")} | {
        (v, AUTOSCALERS) for v in ("get", "list", "watch", "patch")
    } | {("get", "daskclusters.kubernetes.dask.org")} | {(v, "pods") for v in ("get", "list", "watch", "delete")}
    k8s.add_dask_operator("d1", replicas=1, groups={"highmem": 1}, autoscaler={"minimum": 1, "maximum": 5})
    k8s.allow_only(rules)
    backend.scale(REF, 2, timeout=20)
    backend.claim(REF, "p", 3)
    backend.reconcile(REF, timeout=20)
    backend.restart_head(REF, timeout=20)
    backend.release(REF, "p")
    backend.restore_baseline(REF, timeout=20)
    with pytest.raises(InvalidInputError):
        backend.get_state(ClusterRef("dask-operator", "d1", group="nope"))
    assert k8s.requests and all(r.status != 403 for r in k8s.requests)
    assert any(r.method == "PATCH" and "/daskautoscalers/" in r.path for r in k8s.requests)
    k8s.forbid("patch", GROUPS)
    with pytest.raises(UnauthorizedError, match='cannot patch resource "daskworkergroups"'):
        backend.scale(REF, 1, timeout=20)


@pytest.mark.parametrize(
    "manifest, plural, group",
    [("kuberay-cluster.yaml", "rayclusters", "ray.io"), ("dask-operator-cluster.yaml", "daskclusters", "kubernetes.dask.org")],
)
def test_shipped_example_clusters_are_accepted_and_scale(k8s, backend, manifest, plural, group):  # noqa: F811
    import yaml
    from kubernetes import client

    body = yaml.safe_load((ROLE.parent / manifest).read_text())
    namespace = body["metadata"]["namespace"]
    api_client = k8s.api_client()
    try:
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(group, "v1", namespace, plural, body)
    finally:
        api_client.close()
    kind = "kuberay" if group == "ray.io" else "dask-operator"
    ref = ClusterRef(kind, body["metadata"]["name"], namespace)
    if kind == "dask-operator":  # the operator adds the default worker group after the DaskCluster
        group_name = f"{ref.name}-default"

        def group_made() -> bool:
            with k8s.lock:
                return k8s.lookup("daskworkergroups.kubernetes.dask.org", namespace, group_name) is not None

        k8s.wait_for(group_made, timeout=60, what=f"the operator's DaskWorkerGroup {group_name}")
    assert backend.wait_for_workers(ref, 1, timeout=20).desired_workers == 1
    assert backend.scale(ref, 2, timeout=20).final.ready_workers == 2
    assert backend.restore_baseline(ref, timeout=20).effective == 1


def test_two_autoscalers_for_one_cluster_are_refused_before_anything_is_sent(k8s, backend):  # noqa: F811
    from kubernetes import client

    k8s.add_dask_operator("d1", replicas=1, autoscaler={"minimum": 1, "maximum": 5})
    api_client = k8s.api_client()
    try:
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            "kubernetes.dask.org", "v1", "domino-compute", "daskautoscalers",
            {"apiVersion": "kubernetes.dask.org/v1", "kind": "DaskAutoscaler", "metadata": {"name": "d1-other"},
             "spec": {"cluster": "d1", "minimum": 2, "maximum": 4}},
        )
    finally:
        api_client.close()
    k8s.clear_log()
    with pytest.raises(UnsupportedOperationError, match="DaskAutoscalers d1, d1-other"):
        backend.scale(REF, 3, timeout=20)
    assert _patches(k8s) == [] and _replicas(k8s) == 1


@pytest.mark.parametrize(
    "manifest, package, tag",
    [("kuberay-cluster.yaml", "ray", re.compile(r"rayproject/ray:(?P<version>[\d.]+)-py311$")),
     ("dask-operator-cluster.yaml", "distributed", re.compile(r"ghcr\.io/dask/dask:(?P<version>[\d.]+)-py3\.11$"))],
)
def test_shipped_example_images_run_the_framework_versions_constraints_pin(manifest, package, tag):
    """A client installed under constraints.txt must speak to the example cluster (Ray Client needs equal versions)."""
    import yaml

    pins = dict(line.split("==", 1) for line in (ROLE.parents[2] / "constraints.txt").read_text().splitlines() if "==" in line)
    text = (ROLE.parent / manifest).read_text()
    images = [m.group(1) for m in re.finditer(r"image:\s*(\S+)", text)]
    assert images, f"{manifest} names no image"
    for image in images:
        match = tag.match(image)
        assert match and match.group("version") == pins[package], (image, pins[package])
    spec = yaml.safe_load(text)["spec"]
    if "rayVersion" in spec:
        assert spec["rayVersion"] == pins["ray"]


def test_a_restore_whose_workers_the_operator_cannot_retire_says_which_and_why(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1)
    backend.scale(REF, 3, timeout=20)
    k8s.set_dask_scheduler_reachable("d1", False)
    with pytest.raises(ScalingTimeoutError) as caught:
        backend.restore_baseline(REF, timeout=2)
    message = str(caught.value)
    running = sorted(p["metadata"]["name"] for p in _workers(k8s))
    assert len(running) == 3 and _replicas(k8s) == 1
    assert f"3 worker pods for 1 wanted, still running: {', '.join(running)}" in message
    assert "retiring it through the cluster's scheduler" in message and "retries every 60 s" in message
    # Once the operator reaches the scheduler again, the restored size takes effect.
    k8s.set_dask_scheduler_reachable("d1", True)
    assert backend.wait_for_workers(REF, 1, timeout=20).existing_workers == 1


def test_a_wait_goes_on_until_the_operator_creates_the_default_worker_group(k8s, backend):  # noqa: F811
    k8s.set_dask_operator_held("d1", True)
    k8s.add_dask_operator("d1", replicas=2, wait_ready=False)
    pending = threading.Event()
    seen = []

    def progress(report):
        seen.append(report)
        if "waiting for the Dask operator to create DaskWorkerGroup 'd1-default'" in report.detail:
            pending.set()

    def wait():
        try:
            outcome["state"] = backend.wait_for_workers(REF, 2, timeout=60, progress=progress)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc
            pending.set()

    outcome = {}
    thread = threading.Thread(target=wait)
    thread.start()
    try:
        assert pending.wait(30) and "error" not in outcome, outcome.get("error")
    finally:
        # The operator gets to the cluster: its group, scheduler and workers appear (pod events wake the wait).
        k8s.set_dask_operator_held("d1", False)
        thread.join(60)
    assert "error" not in outcome, outcome.get("error")
    state = outcome["state"]
    assert state.ready_workers == 2 and state.desired_workers == 2 and state.status == "Running"
    assert "desired=2 existing=0 ready=0" in seen[0].detail


def test_a_missing_dask_cluster_is_not_found_at_once_and_so_is_a_state_read_before_the_group(k8s, backend):  # noqa: F811
    with pytest.raises(ClusterNotFoundError, match="'d1-default' in namespace 'domino-compute' not found"):
        backend.wait_for_workers(REF, 2, timeout=30)
    k8s.set_dask_operator_held("d1", True)
    k8s.add_dask_operator("d1", replicas=2, wait_ready=False)
    # Only a wait waits: a state read or a scale says what is missing and why.
    with pytest.raises(ClusterNotFoundError, match="DaskCluster 'd1' exists, its operator has not created"):
        backend.get_state(REF)


def test_a_role_without_get_on_daskclusters_keeps_the_groups_not_found(k8s, backend):  # noqa: F811
    k8s.set_dask_operator_held("d1", True)
    k8s.add_dask_operator("d1", replicas=2, wait_ready=False)
    k8s.forbid("get", "daskclusters.kubernetes.dask.org")
    with pytest.raises(ClusterNotFoundError) as caught:
        backend.wait_for_workers(REF, 2, timeout=30)
    assert "exists" not in str(caught.value)
