"""CustomResourceDefinitions built from the repository's own CRD facts, for a real API server.

The test server validates with the structural schemas of
``tests/servers/dco_crds.py`` (Domino's DCO kinds) and
``tests/servers/oss_crds.py`` (KubeRay's RayCluster, the Dask operator's
kinds). The same facts become CRD objects here, so the real API server of the
envtest tier validates, prunes and serves subresources exactly from what the
repository knows, and any disagreement with the test server shows up as a
failing contract test.

Two translations a real API server needs that the test server does not:
an ``object`` without properties (pod templates, free-form status) is kept
as given on the test server, which a real server does only with
``x-kubernetes-preserve-unknown-fields: true``; and the root ``metadata``
may carry nothing but its type.
"""
import copy
from typing import Any, Dict, List

from tests.servers.dco_crds import CUSTOM_RESOURCES, SCHEMAS
from tests.servers.oss_crds import OSS_RESOURCES, OSS_SCHEMAS

from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION


def _real_schema(schema: Dict[str, Any]) -> Dict[str, Any]:
    """``schema`` with every property-less ``object`` preserving unknown fields; a new dict."""
    schema = copy.deepcopy(schema)

    def walk(node: Dict[str, Any]) -> None:
        if node.get("type") == "object" and "properties" not in node and "additionalProperties" not in node:
            node["x-kubernetes-preserve-unknown-fields"] = True
        for child in (node.get("properties") or {}).values():
            walk(child)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])

    for name, child in schema["properties"].items():
        if name != "metadata":
            walk(child)
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def _crd(group: str, version: str, plural: str, kind: str, short_names: List[str], schema: Dict[str, Any],
         status: bool, scale: Dict[str, str]) -> Dict[str, Any]:
    subresources: Dict[str, Any] = {}
    if status:
        subresources["status"] = {}
    if scale:
        subresources["scale"] = scale
    names = {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"}
    if short_names:
        names["shortNames"] = short_names
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group, "scope": "Namespaced", "names": names,
            "versions": [{
                "name": version, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": _real_schema(schema)},
                "subresources": subresources,
            }],
        },
    }


def definitions() -> List[Dict[str, Any]]:
    """Every CRD the test server serves: the four DCO kinds, KubeRay's RayCluster, the Dask operator's three."""
    found = []
    for plural, resource in CUSTOM_RESOURCES.items():
        scale = resource.scale and {
            "specReplicasPath": resource.scale.spec_replicas_path,
            "statusReplicasPath": resource.scale.status_replicas_path,
            "labelSelectorPath": resource.scale.label_selector_path,
        }
        found.append(_crd(CRD_GROUP, CRD_VERSION, plural, resource.kind, [resource.short_name], SCHEMAS[plural],
                          resource.status_subresource, scale or {}))
    for key, resource in OSS_RESOURCES.items():
        # The published Dask CRDs keep .status.replicas for their scale subresource; KubeRay's has none.
        scale = resource.scale_spec_path and {
            "specReplicasPath": resource.scale_spec_path, "statusReplicasPath": ".status.replicas",
        }
        found.append(_crd(resource.group, resource.version, resource.plural, resource.kind, [], OSS_SCHEMAS[key],
                          resource.status_subresource, scale or {}))
    return found


def install(api_client: Any, timeout: float = 30.0) -> List[str]:
    """Create every CRD of :func:`definitions` and wait until each is Established; returns their names.

    Raises ``AssertionError`` naming the CRDs not established within ``timeout`` seconds.
    """
    import time

    from kubernetes import client

    extensions = client.ApiextensionsV1Api(api_client)
    names = []
    for body in definitions():
        extensions.create_custom_resource_definition(body)
        names.append(body["metadata"]["name"])
    deadline = time.monotonic() + timeout
    waiting = list(names)
    while waiting:
        waiting = [
            name for name in waiting
            if not any(c.type == "Established" and c.status == "True"
                       for c in (extensions.read_custom_resource_definition(name).status.conditions or []))
        ]
        if waiting and time.monotonic() > deadline:
            raise AssertionError(f"CRDs not Established after {timeout} s: {', '.join(waiting)}")
        if waiting:
            time.sleep(0.1)
    return names
