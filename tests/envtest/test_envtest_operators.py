"""The open-source operators' shipped examples and Roles, on the test server and on a real kube-apiserver.

The shipped KubeRay RayCluster and Dask-operator DaskCluster
(``examples/k8s/``) are created as written (the real server validates them
with the CRDs built from the repository's facts), and the non-admin user
sizes and restores them: refused (403 naming the resource and its API group)
until the shipped Role (``kuberay-rbac.yaml``, ``dask-operator-rbac.yaml``)
is bound to it, allowed after. No KubeRay or Dask operator runs on the real
server, so these operations do not wait for pods (``wait=False``); what is
checked is what the backend wrote, and that the Dask-operator Role lets a connector's polls take the
DaskAutoscalers from a watch.
"""
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends._base import SharedReads
from flytekitplugins_ddlscale.backends.kubernetes._informer import Resource, running_informers
from flytekitplugins_ddlscale.errors import UnauthorizedError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "k8s"
DASK = "kubernetes.dask.org"


def _create(side, group, plural, body):
    body["metadata"]["namespace"] = side.namespace
    custom = client.CustomObjectsApi(side.admin_client())
    return custom.create_namespaced_custom_object(group, "v1", side.namespace, plural, body)


def _get(side, group, plural, name):
    return client.CustomObjectsApi(side.admin_client()).get_namespaced_custom_object(
        group, "v1", side.namespace, plural, name)


def test_the_shipped_kuberay_cluster_and_role(side):
    body = yaml.safe_load((EXAMPLES / "kuberay-cluster.yaml").read_text())
    _create(side, "ray.io", "rayclusters", body)
    ref = ClusterRef("kuberay", "shared-ray", side.namespace)
    with side.backend(user=True) as backend:
        with pytest.raises(UnauthorizedError, match='cannot get resource "rayclusters" in API group "ray.io"'):
            backend.get_state(ref)
    side.grant(EXAMPLES / "kuberay-rbac.yaml")
    with side.backend(user=True) as backend:
        assert backend.scale(ref, 3, wait=False).final.desired_workers == 3
        group = _get(side, "ray.io", "rayclusters", "shared-ray")["spec"]["workerGroupSpecs"][0]
        assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 3, 8)
        backend.restore_baseline(ref, wait=False)
    group = _get(side, "ray.io", "rayclusters", "shared-ray")["spec"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["minReplicas"]) == (1, 1)


def test_the_shipped_dask_operator_cluster_and_role(side):
    body = yaml.safe_load((EXAMPLES / "dask-operator-cluster.yaml").read_text())
    _create(side, DASK, "daskclusters", body)
    group = {
        "apiVersion": f"{DASK}/v1", "kind": "DaskWorkerGroup",
        "metadata": {"name": "shared-dask-default", "labels": {"dask.org/cluster-name": "shared-dask"}},
        "spec": {"cluster": "shared-dask", "worker": body["spec"]["worker"]},
    }
    try:
        _create(side, DASK, "daskworkergroups", group)  # what the Dask operator does; the test server's did it
    except ApiException as exc:
        assert exc.status == 409
    _create(side, DASK, "daskautoscalers", {
        "apiVersion": f"{DASK}/v1", "kind": "DaskAutoscaler", "metadata": {"name": "shared-dask"},
        "spec": {"cluster": "shared-dask", "minimum": 1, "maximum": 5},
    })
    ref = ClusterRef("dask-operator", "shared-dask", side.namespace)
    with side.backend(user=True) as backend:
        with pytest.raises(UnauthorizedError, match='cannot get resource "daskworkergroups"'):
            backend.get_state(ref)
    side.grant(EXAMPLES / "dask-operator-rbac.yaml")
    with side.backend(user=True) as backend:
        assert backend.scale(ref, 3, wait=False).final.desired_workers == 3
        assert _get(side, DASK, "daskworkergroups", "shared-dask-default")["spec"]["worker"]["replicas"] == 3
        assert _get(side, DASK, "daskautoscalers", "shared-dask")["spec"]["minimum"] == 3
        backend.restore_baseline(ref, wait=False)
    assert _get(side, DASK, "daskworkergroups", "shared-dask-default")["spec"]["worker"]["replicas"] == 1
    assert _get(side, DASK, "daskautoscalers", "shared-dask")["spec"]["minimum"] == 1
    # A connector's polls under the Role: the DaskAutoscalers' bounds come from a watch it may open. Only a
    # watch brings another writer's change to the cache, and the state read from the cache shows it.
    scalers = Resource("daskautoscalers", DASK, "v1")
    reads = SharedReads(linger=60.0)
    with side.backend(user=True) as backend:
        try:
            assert backend.get_state(ref, reads).autoscaling_max == 5
            side.wait_for(lambda: any(i.synced.is_set() for i in running_informers(scalers)), "the DaskAutoscaler cache")
            client.CustomObjectsApi(side.admin_client()).patch_namespaced_custom_object(
                DASK, "v1", side.namespace, "daskautoscalers", "shared-dask", {"spec": {"maximum": 6}},
                _content_type="application/merge-patch+json")
            (cache,) = running_informers(scalers)
            side.wait_for(lambda: any(s["spec"].get("maximum") == 6 for s in cache.fresh_all() or []),
                          "the watch to bring the new maximum")
            assert cache.error is None and backend.get_state(ref, reads).autoscaling_max == 6
        finally:
            for informer in running_informers(None):
                informer.stop()
