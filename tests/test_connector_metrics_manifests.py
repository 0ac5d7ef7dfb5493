"""Prometheus reaches each connector's metrics as docs/connector.md ("Metrics") says: the Deployment's metrics port
is in the Service, the guide's ServiceMonitor selects that Service and port, and the NetworkPolicy admits that port
from Prometheus's pods in Prometheus's namespace only (a namespaceSelector and a podSelector in one peer: both)."""
from pathlib import Path
from typing import Dict

import pytest
import yaml

from tests.flyte_tier.guide import guide_yaml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "k8s"
MANIFESTS = ["connector.yaml", "flyte2-connector.yaml", "scaler-connector.yaml"]
PROMETHEUS_POD = {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"}
"""A Prometheus pod as the Prometheus operator labels it."""


def _objects(manifest) -> Dict[str, Dict]:
    return {d["kind"]: d for d in yaml.safe_load_all((EXAMPLES / manifest).read_text()) if d}


def _selects(selector: Dict, labels: Dict[str, str]) -> bool:
    """A label selector's verdict (``matchLabels``, and ``matchExpressions`` with ``In``: all the pages use)."""
    assert set(selector) <= {"matchLabels", "matchExpressions"}, f"unexpected selector fields: {selector}"
    expressions = selector.get("matchExpressions", [])
    assert all(e["operator"] == "In" for e in expressions), expressions
    return (all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())
            and all(labels.get(e["key"]) in e["values"] for e in expressions))


def _admitted(policy: Dict, port: int, namespace: str, pod: Dict[str, str]) -> bool:
    """Whether ``policy`` (its own namespace's) admits ``pod`` of ``namespace`` to ``port``."""
    own = policy["metadata"]["namespace"]
    namespace_labels = {"kubernetes.io/metadata.name": namespace}
    for rule in policy["spec"]["ingress"]:
        if any(p["port"] == port for p in rule["ports"]):
            for peer in rule["from"]:
                in_namespace = (_selects(peer["namespaceSelector"], namespace_labels) if "namespaceSelector" in peer
                                else namespace == own)
                if in_namespace and _selects(peer.get("podSelector", {}), pod):
                    return True
    return False


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_prometheus_reaches_the_metrics_port_through_the_service_as_the_guide_says(manifest):
    objects = _objects(manifest)
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    options = dict(zip(container["args"][::2], container["args"][1::2]))
    metrics = next(p for p in container["ports"] if p["name"] == "metrics")
    assert metrics["containerPort"] == int(options["--prometheus_port"])
    service = objects["Service"]
    (port,) = [p for p in service["spec"]["ports"] if p["targetPort"] == "metrics"]

    monitor = guide_yaml("connector.md", "connector-service-monitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
    assert service["metadata"]["namespace"] in monitor["spec"]["namespaceSelector"]["matchNames"]
    assert _selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert not _selects(monitor["spec"]["selector"], {"app.kubernetes.io/name": "flyteadmin"})
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [port["name"]]

    policy = objects["NetworkPolicy"]
    prometheus_namespace = monitor["metadata"]["namespace"]
    assert _admitted(policy, metrics["containerPort"], prometheus_namespace, PROMETHEUS_POD)
    assert not _admitted(policy, metrics["containerPort"], "team-a", PROMETHEUS_POD)  # another namespace's
    assert not _admitted(policy, metrics["containerPort"], prometheus_namespace, {"app": "shell"})
    assert not _admitted(policy, int(options["--port"]), prometheus_namespace, PROMETHEUS_POD)  # gRPC: FlytePropeller's


def test_the_admission_check_tells_a_namespace_apart():
    policy = {"metadata": {"namespace": "flyte"}, "spec": {"ingress": [
        {"from": [{"podSelector": {"matchLabels": {"a": "1"}}}], "ports": [{"port": 1}]}]}}
    assert _admitted(policy, 1, "flyte", {"a": "1"}) and not _admitted(policy, 1, "monitoring", {"a": "1"})
