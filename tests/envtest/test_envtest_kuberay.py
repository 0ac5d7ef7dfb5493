"""What the backend writes to a KubeRay RayCluster, on a real kube-apiserver with the RayCluster CRD.

No KubeRay operator runs on the control plane: the test creates the worker
pods KubeRay would (``replicas × numOfHosts``, one replica's pods sharing
``ray.io/worker-group-replica-name``; the fake kubelet makes them Ready),
and checks what the backend patches into the object the real API server
stores: a scale-down names one pod per multi-host replica in
``scaleStrategy.workersToDelete`` and drops names of pods that no longer
exist (KubeRay never clears the list), a partial replica and a suspended
group are refused with the object unchanged.
"""
import pytest
from kubernetes import client

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
from flytekitplugins_ddlscale.errors import InvalidInputError, NotScalableError

pytestmark = pytest.mark.envtest

GONE = "r1-tpu-worker-gone0"
"""A name the Ray autoscaler listed once, of a pod KubeRay deleted long ago."""


def _cluster(namespace):
    template = {"spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.46.0"}]}}
    return {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r1", "namespace": namespace},
        "spec": {
            "rayVersion": "2.46.0", "enableInTreeAutoscaling": True,
            "headGroupSpec": {"rayStartParams": {}, "template": template},
            "workerGroupSpecs": [{
                "groupName": "tpu", "replicas": 2, "minReplicas": 0, "maxReplicas": 4, "numOfHosts": 2,
                "scaleStrategy": {"workersToDelete": [GONE]}, "template": template,
            }],
        },
    }


def _pod(namespace, name, replica):
    labels = {"ray.io/cluster": "r1", "ray.io/node-type": "worker", "ray.io/group": "tpu",
              "ray.io/worker-group-replica-name": replica}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.46.0"}]}}


def _group(custom, namespace):
    obj = custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", "r1")
    return obj, obj["spec"]["workerGroupSpecs"][0]


def test_a_multi_host_scale_down_on_the_real_api_server(envtest):
    namespace = envtest.new_namespace()
    custom, core = client.CustomObjectsApi(envtest.admin), client.CoreV1Api(envtest.admin)
    custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", _cluster(namespace))
    names = {f"r1-tpu-worker-{replica}{host}": f"tpu-{replica}" for replica in "ab" for host in "01"}
    for name, replica in names.items():
        core.create_namespaced_pod(namespace, _pod(namespace, name, replica))
    ref = ClusterRef("kuberay", "r1", namespace, "tpu")
    with KubernetesBackend(kubeconfig=str(envtest.plane.admin_kubeconfig)) as backend:
        before = backend.get_state(ref)
        assert (before.desired_workers, before.existing_workers, before.autoscaling_max) == (4, 4, 8)
        version = _group(custom, namespace)[0]["metadata"]["resourceVersion"]
        with pytest.raises(InvalidInputError, match="numOfHosts 2"):
            backend.scale(ref, 3, wait=False)
        assert _group(custom, namespace)[0]["metadata"]["resourceVersion"] == version
        result = backend.scale(ref, 2, wait=False)
        assert (result.effective, result.final.desired_workers) == (2, 2)
        _, group = _group(custom, namespace)
        assert (group["replicas"], group["minReplicas"]) == (1, 1)
        listed = group["scaleStrategy"]["workersToDelete"]
        assert GONE not in listed and len(listed) == 1 and listed[0] in names
        custom.patch_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", "r1", {
            "spec": {"workerGroupSpecs": [dict(group, suspend=True)]}})
        with pytest.raises(NotScalableError, match=r"spec.workerGroupSpecs\[groupName=tpu\].suspend"):
            backend.scale(ref, 4, wait=False)
        assert backend.get_state(ref).desired_workers == 0
