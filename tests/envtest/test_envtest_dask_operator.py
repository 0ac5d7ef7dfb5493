"""The Kubernetes backend on clusters made by the real Dask operator (dask-kubernetes, kopf) on a real API server.

What the backend assumes of the operator and the test server plays
(docs/kubernetes.md, "Dask-operator clusters") is checked against the
operator itself: it creates the default worker group ``<cluster>-default``
from the DaskCluster's ``spec.worker``, labels pods so the backend's
selectors find the scheduler and the group's workers, and adds one worker
per replica when the group's ``spec.worker.replicas`` is patched.

Scale-down and the DaskAutoscaler need the scheduler: the operator retires
workers through the scheduler's Service and the autoscaler asks it for its
adaptive target. The ``served`` fixture puts a real scheduler and real
workers behind a cluster (:mod:`tests.envtest.dask_runtime`) and makes its
Service resolvable for the operator alone; a cluster without it shows what
happens when the operator cannot reach the scheduler.
"""
import copy
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from kubernetes import client

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
from flytekitplugins_ddlscale.errors import (
    ClusterNotFoundError,
    InvalidInputError,
    ScalingTimeoutError,
    UnreachableWaitError,
)
from flytekitplugins_ddlscale._services.readiness import FrameworkOptions, ReadinessCheck
from tests.envtest.dask_operator import RealDaskOperator
from tests.envtest.dask_runtime import DaskRuntime

pytestmark = pytest.mark.envtest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "k8s" / "dask-operator-cluster.yaml"
DASK = "kubernetes.dask.org"


@pytest.fixture(scope="module")
def dask_operator(envtest) -> Iterator[RealDaskOperator]:
    """The real Dask operator for this module's tests, stopped after them."""
    import importlib.util

    if importlib.util.find_spec("dask_kubernetes") is None or importlib.util.find_spec("kopf") is None:
        pytest.skip("dask-kubernetes (with kopf) is not installed: install the test extra (README 'Install')")
    with RealDaskOperator(envtest.plane.admin_kubeconfig, envtest.plane.work) as operator:
        yield operator


def _wait(predicate, what: str, operator: RealDaskOperator, timeout: float = 60.0) -> None:
    import time

    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; operator log:\n{operator.tail()}")
        time.sleep(0.1)


def _ready(backend: KubernetesBackend, ref: ClusterRef, workers: int) -> bool:
    try:
        state = backend.get_state(ref)
    except (ClusterNotFoundError, InvalidInputError):
        return False  # the operator has not made the default worker group yet
    return state.head_ready is True and state.ready_workers == workers


def test_the_operator_makes_the_cluster_and_the_backend_scales_it_up(envtest, dask_operator):
    namespace = envtest.new_namespace()
    body = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"]["namespace"] = namespace
    custom = client.CustomObjectsApi(envtest.admin)
    custom.create_namespaced_custom_object(DASK, "v1", namespace, "daskclusters", body)
    ref = ClusterRef("dask-operator", "shared-dask", namespace)
    with KubernetesBackend(kubeconfig=str(envtest.plane.admin_kubeconfig), failure_grace=5) as backend:
        def ready() -> bool:
            try:
                state = backend.get_state(ref)
            except (ClusterNotFoundError, InvalidInputError):
                return False  # the operator has not made the default worker group yet
            return state.head_ready is True and state.ready_workers == 1

        _wait(ready, "the operator's scheduler and first worker to be Ready", dask_operator)
        result = backend.scale(ref, 3, timeout=90)
        assert (result.previous.desired_workers, result.final.desired_workers) == (1, 3)
        assert result.final.ready_workers == 3 and result.final.head_ready
        assert backend.get_baseline(ref).replicas == 1
    deployments = client.AppsV1Api(envtest.admin).list_namespaced_deployment(
        namespace, label_selector="dask.org/workergroup-name=shared-dask-default")
    assert len(deployments.items) == 3
    group = custom.get_namespaced_custom_object(DASK, "v1", namespace, "daskworkergroups", "shared-dask-default")
    assert group["spec"]["cluster"] == "shared-dask" and group["spec"]["worker"]["replicas"] == 3


def test_the_state_reports_the_ready_scheduler_whatever_phase_the_operator_wrote(envtest, dask_operator):
    namespace = envtest.new_namespace()
    body = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"]["namespace"] = namespace
    client.CustomObjectsApi(envtest.admin).create_namespaced_custom_object(DASK, "v1", namespace, "daskclusters", body)
    ref = ClusterRef("dask-operator", "shared-dask", namespace)
    with KubernetesBackend(kubeconfig=str(envtest.plane.admin_kubeconfig), failure_grace=5) as backend:
        def ready() -> bool:
            try:
                return backend.get_state(ref).ready_workers == 1
            except (ClusterNotFoundError, InvalidInputError):
                return False

        _wait(ready, "the operator's first worker to be Ready", dask_operator)
        state = backend.get_state(ref)
        assert (state.status, state.head_ready) == ("Running", True)
        # The state a wait starts from is read with the pods (here: a wait refused as unreachable).
        with pytest.raises(UnreachableWaitError) as caught:
            backend.wait_for_workers(ref, 4, timeout=30)
        assert (caught.value.state.status, caught.value.state.head_ready) == ("Running", True)
        # A scheduler restart's final state counts the workers too.
        restarted = backend.restart_head(ref, timeout=60)
        assert restarted.ready and restarted.final.head_ready is True
        assert (restarted.final.existing_workers, restarted.final.ready_workers) == (1, 1)


@pytest.fixture
def served(envtest, dask_operator, tmp_path) -> Iterator[DaskRuntime]:
    """A DaskCluster ``served-dask`` in a new namespace with a real scheduler and workers behind it, its
    scheduler Service resolvable by the operator (skipped where the operator cannot get its own /etc/hosts)."""
    if dask_operator.dns is None:
        pytest.skip("no private mount namespace here (unshare -rm): the operator cannot resolve the scheduler")
    namespace = envtest.new_namespace()
    with DaskRuntime(envtest.admin, namespace, "served-dask", tmp_path) as runtime:
        dask_operator.dns.serve("served-dask-scheduler", namespace)
        body = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
        body["metadata"].update(name="served-dask", namespace=namespace)
        body["spec"]["scheduler"]["service"] = runtime.service()
        client.CustomObjectsApi(envtest.admin).create_namespaced_custom_object(
            DASK, "v1", namespace, "daskclusters", body)
        yield runtime


def _registered(runtime: DaskRuntime, count: int, operator: RealDaskOperator) -> None:
    _wait(lambda: len(runtime.registered()) == count, f"{count} workers registered with the real scheduler",
          operator, timeout=90)


def test_a_restore_waits_while_the_operator_retires_workers_through_the_real_scheduler(envtest, dask_operator, served):
    ref = ClusterRef("dask-operator", "served-dask", served.namespace)
    with KubernetesBackend(kubeconfig=str(envtest.plane.admin_kubeconfig), failure_grace=5) as backend:
        _wait(lambda: _ready(backend, ref, 1), "the operator's scheduler and first worker", dask_operator)
        backend.scale(ref, 3, timeout=90)
        _registered(served, 3, dask_operator)
        result = backend.restore_baseline(ref, timeout=120)
        assert (result.previous.desired_workers, result.final.desired_workers) == (3, 1)
        assert result.final.existing_workers == 1 and result.final.ready_workers == 1
        readiness = ReadinessCheck(backend, ref, FrameworkOptions(url=served.dashboard, env={})).change(result, 60)
        assert f"1 workers registered with the Dask scheduler at {served.dashboard}" in readiness.proof
    deployments = client.AppsV1Api(envtest.admin).list_namespaced_deployment(
        served.namespace, label_selector="dask.org/workergroup-name=served-dask-default")
    kept = [d.metadata.name for d in deployments.items]
    _registered(served, 1, dask_operator)
    # The operator deleted the Deployments of the workers the scheduler retired, not its LIFO fallback's.
    assert served.registered() == kept, dask_operator.tail()
    assert "falling back to LIFO" not in dask_operator.tail(200000)
    assert "Retired workers" in dask_operator.tail(200000)


def _group_replicas(envtest, namespace: str, name: str) -> int:
    group = client.CustomObjectsApi(envtest.admin).get_namespaced_custom_object(
        DASK, "v1", namespace, "daskworkergroups", f"{name}-default")
    return group["spec"]["worker"]["replicas"]


def test_a_size_is_held_against_a_daskautoscaler_following_the_real_scheduler(envtest, dask_operator, served):
    namespace, custom = served.namespace, client.CustomObjectsApi(envtest.admin)
    ref = ClusterRef("dask-operator", "served-dask", namespace)
    with KubernetesBackend(kubeconfig=str(envtest.plane.admin_kubeconfig), failure_grace=5) as backend:
        _wait(lambda: _ready(backend, ref, 1), "the operator's scheduler and first worker", dask_operator)
        custom.patch_namespaced_custom_object(DASK, "v1", namespace, "daskworkergroups", "served-dask-default",
                                              {"spec": {"worker": {"replicas": 2}}})
        _registered(served, 2, dask_operator)
        # Unheld, the autoscaler follows the idle scheduler's adaptive target (0) down to its minimum.
        custom.create_namespaced_custom_object(DASK, "v1", namespace, "daskautoscalers", {
            "apiVersion": f"{DASK}/v1", "kind": "DaskAutoscaler", "metadata": {"name": "served-dask"},
            "spec": {"cluster": "served-dask", "minimum": 1, "maximum": 5}})
        _wait(lambda: "from 2 to 1" in dask_operator.tail(200000), "the autoscaler to pull 2 workers back to 1",
              dask_operator, timeout=90)
        _wait(lambda: _ready(backend, ref, 1) and len(served.registered()) == 1, "1 worker again", dask_operator,
              timeout=90)
        result = backend.scale(ref, 3, timeout=90)
        assert result.effective == 3 and not result.capped
        scaler = custom.get_namespaced_custom_object(DASK, "v1", namespace, "daskautoscalers", "served-dask")
        assert scaler["spec"]["minimum"] == 3
        _registered(served, 3, dask_operator)
        # Held: adapt cycles (every 5 s, 15 s cooldown after a change) keep max(minimum, target) = 3.
        time.sleep(20)
        assert _group_replicas(envtest, namespace, "served-dask") == 3, dask_operator.tail()
        assert "from 3 to" not in dask_operator.tail(200000)
        backend.restore_baseline(ref, timeout=120)
        scaler = custom.get_namespaced_custom_object(DASK, "v1", namespace, "daskautoscalers", "served-dask")
        assert scaler["spec"]["minimum"] == 1
    _registered(served, 1, dask_operator)
    assert _group_replicas(envtest, namespace, "served-dask") == 1


def test_a_restore_the_operator_cannot_carry_out_ends_at_its_deadline_saying_why(envtest, dask_operator):
    namespace = envtest.new_namespace()
    body = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"].update(name="unserved-dask", namespace=namespace)
    client.CustomObjectsApi(envtest.admin).create_namespaced_custom_object(DASK, "v1", namespace, "daskclusters", body)
    ref = ClusterRef("dask-operator", "unserved-dask", namespace)
    with KubernetesBackend(kubeconfig=str(envtest.plane.admin_kubeconfig), failure_grace=5) as backend:
        _wait(lambda: _ready(backend, ref, 1), "the operator's scheduler and first worker", dask_operator)
        backend.scale(ref, 3, timeout=90)
        with pytest.raises(ScalingTimeoutError) as caught:
            backend.restore_baseline(ref, timeout=20)
    pods = client.CoreV1Api(envtest.admin).list_namespaced_pod(
        namespace, label_selector="dask.org/workergroup-name=unserved-dask-default")
    running = sorted(p.metadata.name for p in pods.items)
    assert len(running) == 3, dask_operator.tail()
    message = str(caught.value)
    assert f"3 worker pods for 1 wanted, still running: {', '.join(running)}" in message
    assert "retiring it through the cluster's scheduler" in message
    # The operator's retire failed (no name resolves, the port-forward fallback has no kubelet to reach): kopf retries.
    _wait(lambda: "unserved-dask-default] Handler 'daskworkergroup_replica_update/spec.worker.replicas' failed "
          "with an exception and will try again in 60 seconds" in dask_operator.tail(400000),
          "the operator to report the failed retire", dask_operator)
