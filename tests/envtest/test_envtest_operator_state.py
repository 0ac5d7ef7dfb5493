"""The state of a KubeRay RayCluster on a real kube-apiserver, with the pods KubeRay makes.

No KubeRay operator runs in the tier, so the test plays its part: the shipped
RayCluster is created as written, its head and worker pods with the labels
KubeRay gives them (``ray.io/cluster``, ``ray.io/node-type``, ``ray.io/group``,
the head's group ``headgroup``; the fake kubelet makes them Ready), and its
``status.state`` written through the status subresource as KubeRay writes it.
The backend reads the head's readiness from the head pod and the status from
``status.state``.
"""
import copy
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
from flytekitplugins_ddlscale.errors import UnreachableWaitError

pytestmark = pytest.mark.envtest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "k8s" / "kuberay-cluster.yaml"


def _pod(name: str, node_type: str, group: str) -> dict:
    labels = {"ray.io/cluster": "shared-ray", "ray.io/node-type": node_type, "ray.io/group": group,
              "ray.io/is-ray-node": "yes", "app.kubernetes.io/created-by": "kuberay-operator"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": f"ray-{node_type}", "image": "rayproject/ray:2.60.0-py311"}]}}


def test_the_head_pod_and_status_state_make_the_state(envtest):
    namespace = envtest.new_namespace()
    body = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"]["namespace"] = namespace
    custom = client.CustomObjectsApi(envtest.admin)
    core = client.CoreV1Api(envtest.admin)
    custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", body)
    core.create_namespaced_pod(namespace, _pod("shared-ray-head-x7k2p", "head", "headgroup"))
    core.create_namespaced_pod(namespace, _pod("shared-ray-workers-worker-q9z4m", "worker", "workers"))
    ref = ClusterRef("kuberay", "shared-ray", namespace)
    with KubernetesBackend(kubeconfig=str(envtest.plane.admin_kubeconfig)) as backend:
        state = backend.wait_for_workers(ref, 1, timeout=30)
        # The kubelet may mark the worker Ready before the head (it did at load 18): wait for both.
        ends = time.monotonic() + 30
        while not state.head_ready and time.monotonic() < ends:
            time.sleep(0.2)
            state = backend.get_state(ref)
        # KubeRay has not written status.state yet: the Ready head pod says the cluster is starting.
        assert (state.status, state.head_ready, state.ready_workers) == ("Starting", True, 1)
        custom.patch_namespaced_custom_object_status(
            "ray.io", "v1", namespace, "rayclusters", "shared-ray", {"status": {"state": "ready"}})
        assert backend.get_state(ref).status == "Running"
        with pytest.raises(UnreachableWaitError) as caught:
            backend.wait_for_workers(ref, 9, timeout=30)
        assert (caught.value.state.status, caught.value.state.head_ready) == ("Running", True)
