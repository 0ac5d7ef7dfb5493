"""The Kubernetes backend on clusters made by the real Dask operator (dask-kubernetes, kopf) on a real API server.

What the backend assumes of the operator and the test server plays
(docs/kubernetes.md, "Dask-operator clusters") is checked against the
operator itself: it creates the default worker group ``<cluster>-default``
from the DaskCluster's ``spec.worker``, labels pods so the backend's
selectors find the scheduler and the group's workers, and adds one worker
per replica when the group's ``spec.worker.replicas`` is patched. Scale-down
is not tested here: the operator retires workers through the scheduler's
Service, which resolves nowhere on this control plane.
"""
import copy
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from kubernetes import client

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
from flytekitplugins_ddlscale.errors import ClusterNotFoundError, InvalidInputError, UnreachableWaitError
from tests.envtest.dask_operator import RealDaskOperator

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
