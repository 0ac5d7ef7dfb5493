"""The shipped connector deployment (examples/k8s/connector.yaml, docs/connector.md) agrees with the service."""
import re
import shlex
from pathlib import Path

import yaml

from flytekitplugins_ddlscale.connector import SERVED_TASK_TYPES
from tests.flyte_tier.guide import guide_yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "examples" / "k8s" / "connector.yaml"
GUIDE = ROOT / "docs" / "connector.md"


def _objects():
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc}


def test_the_deployment_serves_the_plugins_connector_on_the_port_the_service_and_probes_use():
    objects = _objects()
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["pyflyte", "serve", "connector"]  # stock: the entry point registers the types
    options = dict(zip(container["args"][::2], container["args"][1::2]))
    assert "--modules" not in options
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": int(options["--port"]), "metrics": int(options["--prometheus_port"])}
    assert container["readinessProbe"]["grpc"]["port"] == ports["grpc"]  # the connector extra's health service
    service = objects["Service"]["spec"]
    assert service["type"] == "ClusterIP" and service["ports"][0]["targetPort"] == "grpc"
    labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"] == labels == objects["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"]
    admitted = {rule["ports"][0]["port"] for rule in objects["NetworkPolicy"]["spec"]["ingress"]}
    assert admitted == set(ports.values())


def test_the_guide_pins_exactly_the_task_types_the_connector_serves_at_the_services_endpoint():
    """The guide's FlytePropeller block (tests/flyte_tier/test_flyte_charts.py renders it into each distribution)."""
    text = GUIDE.read_text()
    plugin = guide_yaml("connector.md", "propeller-connector-service")["plugins"]["connector-service"]
    assert sorted(plugin["supportedTaskTypes"]) == sorted(SERVED_TASK_TYPES)
    objects = _objects()
    service = objects["Service"]
    expected = (f"dns:///{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local:"
                f"{service['spec']['ports'][0]['port']}")  # gRPC's DNS resolver: no RBAC for FlytePropeller
    assert plugin["defaultConnector"]["endpoint"] == expected
    commands = [shlex.split(c) for c in re.findall(r"`(pyflyte serve connector[^`]*)`", text.replace("\n", " "))]
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] + container["args"] in commands
