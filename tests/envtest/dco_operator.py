"""A stand-in for Domino's distributed-compute operator (DCO) on the envtest tier's real API server.

The real operator turns each cluster object into StatefulSets (and Services,
an HPA, network policies) and keeps the object's ``status`` current
(docs/kubernetes.md, "The custom resources"). This stand-in does the part the
backend relies on, through the real API: per cluster one head StatefulSet
``<name>-<app>-<head component>`` of 1 replica (none for MPI) and one worker
StatefulSet ``<name>-<app>-worker`` of ``spec.worker.replicas``, their pod
templates built from the sections' labels, node selector and resources, and
owned by the cluster object (the garbage collector removes them with it).
The real StatefulSet controller then creates, deletes, recreates and rolls
the pods (``<sts>-<ordinal>``); :class:`~kubelet.FakeKubelet` makes them
Ready. ``status`` (``clusterStatus``, ``nodes``, ``workerReplicas``,
``workerSelector``, ``startTime``, ``image``) is written through the status
subresource.

Not played: the HPA (no metrics API here) and the admission webhook.
"""
import functools
import hashlib
import json
from typing import Any, Dict, List, Optional

from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION, LABEL_APP, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY, LAYOUTS, MANAGED_BY_OPERATOR

from .kubelet import Reacting, Reactor, each, iso_now

DCO_KINDS = [info for info in LAYOUTS.values() if info.flavour == "dco"]
TEMPLATE_ANNOTATION = "envtest.ddlscale.io/template-hash"
MERGE = "application/merge-patch+json"


def _loads(response: Any) -> Dict[str, Any]:
    return json.loads(response.data)


class DcoStandIn(Reacting):
    """Reconciles every DCO cluster object of the API server into StatefulSets and a status."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        watches = [
            functools.partial(self.custom.list_cluster_custom_object, CRD_GROUP, CRD_VERSION, info.plural)
            for info in DCO_KINDS
        ] + [self.apps.list_stateful_set_for_all_namespaces, self.core.list_pod_for_all_namespaces]
        self._reactor = Reactor("envtest-dco", watches, self._act, period=1.0)

    def _act(self) -> Optional[float]:
        sets = {
            (s["metadata"]["namespace"], s["metadata"]["name"]): s
            for s in _loads(self.apps.list_stateful_set_for_all_namespaces(_preload_content=False))["items"]
        }
        pods: Dict[Any, List[Dict[str, Any]]] = {}
        for pod in _loads(self.core.list_pod_for_all_namespaces(
                label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY_OPERATOR}", _preload_content=False))["items"]:
            meta = pod["metadata"]
            # Indexed once per pass: a scan of every pod per cluster is quadratic for a fleet of clusters.
            key = (meta["namespace"], meta["labels"].get(LABEL_INSTANCE), meta["labels"].get(LABEL_APP))
            pods.setdefault(key, []).append(pod)
        for info in DCO_KINDS:
            listed = _loads(self.custom.list_cluster_custom_object(
                CRD_GROUP, CRD_VERSION, info.plural, _preload_content=False))["items"]
            each(functools.partial(self._reconcile, info, sets=sets, pods=pods),
                 [obj for obj in listed if not obj["metadata"].get("deletionTimestamp")])
        return None

    def _reconcile(self, info: Any, obj: Dict[str, Any], sets: Dict[Any, Dict[str, Any]],
                   pods: Dict[Any, List[Dict[str, Any]]]) -> None:
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        worker = spec.get("worker") or {}
        replicas = int(worker.get("replicas", 1))
        self._ensure_set(info, obj, "worker", worker, replicas, sets)
        if info.head_section:
            self._ensure_set(info, obj, info.head_component, spec.get(info.head_section) or {}, 1, sets)
        self._update_status(info, obj, replicas, pods.get((namespace, name, info.app), []))

    def _ensure_set(self, info: Any, obj: Dict[str, Any], component: str, section: Dict[str, Any], replicas: int,
                    sets: Dict[Any, Dict[str, Any]]) -> None:
        namespace, cluster = obj["metadata"]["namespace"], obj["metadata"]["name"]
        name = f"{cluster}-{info.app}-{component}"
        selector = {LABEL_APP: info.app, LABEL_INSTANCE: cluster, LABEL_COMPONENT: component}
        labels = dict(section.get("labels") or {})
        labels.update(selector)
        labels[LABEL_MANAGED_BY] = MANAGED_BY_OPERATOR
        template = {
            "metadata": {"labels": labels, "annotations": dict(section.get("annotations") or {})},
            "spec": {
                "nodeSelector": dict(section.get("nodeSelector") or {}),
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": info.app, "image": "test", "resources": section.get("resources") or {}}],
            },
        }
        digest = hashlib.sha1(json.dumps(template, sort_keys=True).encode()).hexdigest()[:12]
        current = sets.get((namespace, name))
        if current is None:
            body = {
                "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {
                    "name": name, "namespace": namespace, "labels": selector,
                    "annotations": {TEMPLATE_ANNOTATION: digest},
                    "ownerReferences": [{
                        "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}", "kind": info.crd_kind, "name": cluster,
                        "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
                    }],
                },
                "spec": {
                    "replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": selector}, "template": template,
                },
            }
            self.apps.create_namespaced_stateful_set(namespace, body)
            return
        same_template = (current["metadata"].get("annotations") or {}).get(TEMPLATE_ANNOTATION) == digest
        if same_template and current["spec"].get("replicas") == replicas:
            return
        patch: Dict[str, Any] = {"spec": {"replicas": replicas}}
        if not same_template:
            patch["metadata"] = {"annotations": {TEMPLATE_ANNOTATION: digest}}
            patch["spec"]["template"] = template
        self.apps.patch_namespaced_stateful_set(name, namespace, patch, _content_type=MERGE)

    def _update_status(self, info: Any, obj: Dict[str, Any], replicas: int, pods: List[Dict[str, Any]]) -> None:
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        workers = [p for p in pods if p["metadata"]["labels"].get(LABEL_COMPONENT) == "worker"]
        head_ready = any(_ready(p) for p in pods if p not in workers)
        if info.head_section:
            phase = "Running" if head_ready else "Starting"
        else:
            phase = "Running" if sum(1 for p in workers if _ready(p)) >= replicas else "Starting"
        old = obj.get("status") or {}
        status = {
            "clusterStatus": phase,
            "nodes": sorted(p["metadata"]["name"] for p in pods),
            "workerReplicas": replicas,
            "workerSelector": f"{LABEL_INSTANCE}={name},{LABEL_COMPONENT}=worker",
            "image": "test",
            "startTime": old.get("startTime") or iso_now(),
        }
        if any(old.get(key) != value for key, value in status.items()):
            self.custom.patch_namespaced_custom_object_status(
                CRD_GROUP, CRD_VERSION, namespace, info.plural, name, {"status": status}, _content_type=MERGE)


def _ready(pod: Dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])
