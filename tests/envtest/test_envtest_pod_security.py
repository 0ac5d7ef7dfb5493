"""Each connector Deployment of examples/k8s/ runs in a namespace that enforces Kubernetes' "restricted" Pod
Security level: on the real kube-apiserver (its PodSecurity admission plugin, on by default) the Deployment's
ReplicaSet creates its pod, while the same Deployment with one of the level's requirements dropped is refused
pods, the ReplicaSet saying which rule it broke."""
import copy
import time
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "k8s"
CONNECTORS = ["connector.yaml", "flyte2-connector.yaml", "scaler-connector.yaml"]
WAIT = 30.0
"""Seconds the Deployment and ReplicaSet controllers get to create the pod, or to record that they could not."""

pytestmark = pytest.mark.envtest


def _deployment(manifest):
    return next(d for d in yaml.safe_load_all((EXAMPLES / manifest).read_text()) if d and d["kind"] == "Deployment")


def _restricted_namespace(envtest):
    from kubernetes import client

    namespace = envtest.new_namespace()
    client.CoreV1Api(envtest.admin).patch_namespace(namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    return namespace


def _outcome(envtest, deployment):
    """``deployment`` created in a new namespace that enforces the restricted level: ("admitted", pod name) once
    its ReplicaSet made its pod, ("refused", message) once the ReplicaSet records a ReplicaFailure;
    AssertionError after :data:`WAIT` seconds of neither."""
    from kubernetes import client

    namespace = _restricted_namespace(envtest)
    apps, core = client.AppsV1Api(envtest.admin), client.CoreV1Api(envtest.admin)
    deployment = copy.deepcopy(deployment)
    deployment["metadata"]["namespace"] = namespace
    apps.create_namespaced_deployment(namespace, deployment)
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    deadline = time.monotonic() + WAIT
    try:
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(namespace, label_selector=selector).items
            if pods:
                return "admitted", pods[0].metadata.name
            for replica_set in apps.list_namespaced_replica_set(namespace, label_selector=selector).items:
                for condition in replica_set.status.conditions or []:
                    if condition.type == "ReplicaFailure" and condition.status == "True":
                        return "refused", condition.message
            time.sleep(0.2)
        raise AssertionError(f"no pod and no ReplicaFailure for {deployment['metadata']['name']} within {WAIT:g} s")
    finally:
        apps.delete_namespaced_deployment(deployment["metadata"]["name"], namespace, propagation_policy="Foreground")


@pytest.mark.parametrize("manifest", CONNECTORS)
def test_the_connector_pod_passes_the_restricted_level_and_a_laxer_one_does_not(envtest, manifest):
    deployment = _deployment(manifest)
    assert _outcome(envtest, deployment)[0] == "admitted"

    for dropped, rule in (("capabilities", "unrestricted capabilities"), ("seccompProfile", "seccompProfile"),
                          ("allowPrivilegeEscalation", "allowPrivilegeEscalation != false")):
        laxer = copy.deepcopy(deployment)
        del laxer["spec"]["template"]["spec"]["containers"][0]["securityContext"][dropped]
        verdict, message = _outcome(envtest, laxer)
        assert verdict == "refused" and 'violates PodSecurity "restricted:latest"' in message, (dropped, message)
        assert rule in message, (dropped, message)
