"""The test API server enforces the DCO CRD schemas: no more, no less than a real API server.

The schemas come from the project's own facts (``tests/servers/dco_crds.py``,
written in ``tests/servers/schema_notation.py``). Requests go through the
official ``kubernetes`` client, as in ``test_k8s_server.py``.
"""
import copy
import json

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.servers import crd_compare
from tests.servers.dco_crds import CUSTOM_RESOURCES, SCHEMAS, TYPES
from tests.servers.k8s_fixtures import k8s  # noqa: F401 - fixture
from tests.servers.k8s_server import K8sTestServer
from tests.servers.schema_notation import NotationError, parse, to_schema

from flytekitplugins_ddlscale.backends._support.crds import LAYOUTS

KINDS = {kind: layout for kind, layout in LAYOUTS.items() if layout.flavour == "dco"}
"""Domino's kinds: the CRDs of dco_crds (the open-source operators' are in oss_crds)."""

GROUP, VERSION, NS = "distributed-compute.dominodatalab.com", "v1alpha1", "domino-compute"
MERGE, JSON_PATCH = "application/merge-patch+json", "application/json-patch+json"


@pytest.fixture
def custom(k8s):  # noqa: F811
    api_client = k8s.api_client()
    yield client.CustomObjectsApi(api_client)
    api_client.close()


def _patch(custom, kind, name, body, content_type=MERGE):
    plural = KINDS[kind].plural
    return custom.patch_namespaced_custom_object(GROUP, VERSION, NS, plural, name, body, _content_type=content_type)


@pytest.mark.parametrize(
    "kind, body, field, words",
    [
        ("ray", {"spec": {"worker": {"replicas": True}}}, "spec.worker.replicas", "integer"),
        ("ray", {"spec": {"worker": {"replicas": 2.5}}}, "spec.worker.replicas", "integer"),
        ("ray", {"spec": {"objectStoreMemoryBytes": "1Gi"}}, "spec.objectStoreMemoryBytes", "integer"),
        ("ray", {"spec": {"image": "rayproject/ray:2.9"}}, "spec.image", "object"),
        ("ray", {"spec": {"autoscaling": {"minReplicas": 1}}}, "spec.autoscaling.maxReplicas", "Required value"),
        ("ray", {"spec": {"envVars": [{"value": "1"}]}}, "spec.envVars.0.name", "Required value"),
        ("ray", {"spec": {"worker": {"tolerations": [{"key": "gpu", "tolerationSeconds": "60"}]}}},
         "spec.worker.tolerations.0.tolerationSeconds", "integer"),
        ("ray", {"spec": {"worker": {"volumes": [{"emptyDir": {}}]}}}, "spec.worker.volumes.0.name", "Required value"),
        ("ray", {"spec": {"head": {"volumeMounts": [{"name": "data"}]}}}, "spec.head.volumeMounts.0.mountPath",
         "Required value"),
        ("dask", {"spec": {"worker": {"resources": {"requests": {"cpu": "lots"}}}}},
         "spec.worker.resources.requests.cpu", "should match"),
        ("dask", {"spec": {"worker": {"resources": {"limits": {"memory": 1.5}}}}},
         "spec.worker.resources.limits.memory", "not valid under any"),
        ("dask", {"spec": {"worker": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {}}}}}},
         "spec.worker.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
         "Required value"),
        ("spark", {"spec": {"worker": {"labels": {"dominodatalab.com/hardware-tier-id": 7}}}},
         "spec.worker.labels.dominodatalab.com/hardware-tier-id", "string"),
        ("spark", {"spec": {"master": {"nodeSelector": ["gpu-pool"]}}}, "spec.master.nodeSelector", "object"),
        ("spark", {"spec": {"workerMemoryLimit": 4}}, "spec.workerMemoryLimit", "string"),
        ("mpi", [{"op": "remove", "path": "/spec/worker/sharedSSHSecret"}], "spec.worker.sharedSSHSecret",
         "Required value"),
    ],
)
def test_schema_refuses_what_the_crd_refuses(k8s, custom, kind, body, field, words):  # noqa: F811
    k8s.add_cluster(kind, "c1", replicas=1, wait_ready=False)
    before = k8s.get_object(kind, "c1")
    content_type = JSON_PATCH if isinstance(body, list) else MERGE
    with pytest.raises(ApiException) as err:
        _patch(custom, kind, "c1", body, content_type)
    assert err.value.status == 422
    status = json.loads(err.value.body)
    assert status["reason"] == "Invalid" and "admission webhook" not in status["message"]
    causes = {}
    for cause in status["details"]["causes"]:
        causes[cause["field"]] = causes.get(cause["field"], "") + cause["message"] + "; "
    assert field in causes and words in causes[field], causes
    assert k8s.get_object(kind, "c1")["spec"] == before["spec"]


def test_schema_accepts_what_the_crd_accepts(k8s, custom):  # noqa: F811
    """Not stricter than the CRD: quantities as numbers, int64s, int-or-string ports, core types."""
    k8s.add_cluster("ray", "c1", replicas=1, wait_ready=False)
    worker = {
        "resources": {"requests": {"cpu": 2, "memory": "1.5Gi", "nvidia.com/gpu": 1},
                      "limits": {"cpu": "500m", "memory": "2Gi"}},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 60}],
        "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "1Gi"}},
                    {"name": "cfg", "configMap": {"name": "c", "items": [{"key": "k", "path": "p"}]}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}},
        "initContainers": [{"name": "init", "image": "busybox", "ports": [{"containerPort": 80}],
                            "livenessProbe": {"httpGet": {"port": "http", "path": "/"}}}],
    }
    body = {
        "spec": {
            "worker": worker,
            "objectStoreMemoryBytes": 2 ** 40,
            "additionalClientPorts": [{"port": 8080, "targetPort": "http"}, {"port": 8081, "targetPort": 9000}],
            "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "averageCPUUtilization": 50},
        }
    }
    after = _patch(custom, "ray", "c1", body)
    for key, value in worker.items():
        assert after["spec"]["worker"][key] == value
    assert after["spec"]["objectStoreMemoryBytes"] == 2 ** 40
    assert after["spec"]["additionalClientPorts"] == body["spec"]["additionalClientPorts"]


def test_unknown_fields_are_pruned_at_every_depth_but_maps_and_metadata_are_kept(k8s, custom):  # noqa: F811
    k8s.add_cluster("dask", "d1", replicas=1, wait_ready=False)
    body = {
        "metadata": {"annotations": {"team/anything": "kept"}},
        "spec": {
            "bogus": 1,
            "scheduler": {"bogus": 1, "nodeSelector": {"any/key": "kept"}},
            "worker": {
                "volumes": [{"name": "v", "bogus": 1, "emptyDir": {"medium": "Memory", "bogus": 1}}],
                "affinity": {"bogus": 1, "podAffinity": {"bogus": 1}},
            },
        },
    }
    after = _patch(custom, "dask", "d1", body)
    spec = after["spec"]
    assert "bogus" not in spec and "bogus" not in spec["scheduler"]
    assert spec["scheduler"]["nodeSelector"] == {"any/key": "kept"}
    assert spec["worker"]["volumes"] == [{"name": "v", "emptyDir": {"medium": "Memory"}}]
    assert spec["worker"]["affinity"] == {"podAffinity": {}}
    assert after["metadata"]["annotations"]["team/anything"] == "kept"


def test_status_subresource_is_validated_too(k8s, custom):  # noqa: F811
    k8s.add_cluster("spark", "s1", replicas=1, wait_ready=False)
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, "sparkclusters", "s1", {"status": {"workerReplicas": "two"}}, _content_type=MERGE
        )
    assert err.value.status == 422 and "status.workerReplicas" in json.loads(err.value.body)["message"]


@pytest.mark.parametrize("kind", ["ray", "spark", "dask", "mpi"])
def test_operator_status_fills_the_scale_subresource_paths(k8s, kind):  # noqa: F811
    """Where the CRD has a scale subresource, its status paths hold the worker count and selector."""
    k8s.add_cluster(kind, "c1", replicas=2)
    obj = k8s.get_object(kind, "c1")
    scale = CUSTOM_RESOURCES[KINDS[kind].plural].scale
    if kind == "mpi":
        assert scale is None
        return

    def read(path):
        value = obj
        for part in path.lstrip(".").split("."):
            value = value[part]
        return value

    assert read(scale.spec_replicas_path) == read(scale.status_replicas_path) == 2
    selected = {p["metadata"]["name"] for p in k8s.pods("c1", kind=kind)
                if all(p["metadata"]["labels"].get(k) == v
                       for k, v in (term.split("=") for term in read(scale.label_selector_path).split(",")))}
    assert selected == {p["metadata"]["name"] for p in k8s.pods("c1", component="worker", kind=kind)}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_package_kind_table_matches_the_crd_facts(kind):
    """The Kubernetes layouts (crds.LAYOUTS, used by every backend) name the sections the CRDs really have."""
    info = KINDS[kind]
    resource = CUSTOM_RESOURCES[info.plural]
    spec = SCHEMAS[info.plural]["properties"]["spec"]["properties"]
    assert resource.kind == info.crd_kind
    assert ("autoscaling" in spec) == info.autoscaling
    assert "replicas" in spec["worker"]["properties"]
    if info.head_section is not None:
        assert "replicas" not in spec[info.head_section]["properties"]
    assert set(CUSTOM_RESOURCES) == {i.plural for i in KINDS.values()}


def test_schemas_are_built_once_not_per_server():
    with K8sTestServer() as first, K8sTestServer() as second:
        assert first.schemas is second.schemas
        assert all(first.schemas[plural] is schema for plural, schema in SCHEMAS.items())


def test_every_defined_type_is_used():
    used = set()

    def visit(name):
        if name in used:
            return
        used.add(name)
        for _, _, token in TYPES[name]:
            inner = token.strip("[]{}")
            if inner in TYPES:
                visit(inner)

    for resource in CUSTOM_RESOURCES.values():
        visit(resource.kind)
    bases = {"Object", "Workload", "Workers", "ClusterSpec", "ConfigMapProjection", "DownwardAPIProjection"}
    assert set(TYPES) - used <= bases


def test_notation_translates_each_type_token():
    types = parse(
        """
Port         port!:int32 name      # a comment
Base         tags:{} sizes:{quantity}
             target:intstr
Thing(Base)  ports:[Port] names:[] on:bool data:bytes at:datetime meta:object big:int64
"""
    )
    schema = to_schema(types, "Thing")
    props = schema["properties"]
    assert "required" not in schema and list(props)[:3] == ["tags", "sizes", "target"]
    assert props["ports"] == {"type": "array", "items": {
        "type": "object", "properties": {"port": {"type": "integer", "format": "int32"}, "name": {"type": "string"}},
        "required": ["port"]}}
    assert props["names"] == {"type": "array", "items": {"type": "string"}}
    assert props["tags"] == {"type": "object", "additionalProperties": {"type": "string"}}
    assert props["sizes"]["additionalProperties"]["pattern"].startswith("^(\\+|-)?")
    assert props["target"]["x-kubernetes-int-or-string"] and "pattern" not in props["target"]
    assert [props[k]["type"] for k in ("on", "data", "at", "meta", "big")] == [
        "boolean", "string", "string", "object", "integer"]
    assert (props["data"]["format"], props["at"]["format"], props["big"]["format"]) == ("byte", "date-time", "int64")


@pytest.mark.parametrize(
    "text, words",
    [
        ("A  x:Missing\n", "unknown type 'Missing'"),
        ("A  x\nA  y\n", "defined twice"),
        ("A  x x:int32\n", "field x of A is defined twice"),
        ("B(A)  x\nA  y\n", "must be defined above"),
        ("  x\n", "continuation line before any type"),
        ("A  x:\n", "malformed field"),
        ("a-b  x\n", "expected 'Name'"),
    ],
)
def test_notation_errors_name_the_problem(text, words):
    with pytest.raises(NotationError, match=words):
        to_schema(parse(text), "A")


def _published_crd(resource):
    """A CRD file as the operator publishes it, made from the facts (with descriptions and defaults)."""
    schema = copy.deepcopy(SCHEMAS[resource.plural])
    schema["description"] = f"{resource.kind} is the Schema for the {resource.plural} API"
    port = schema["properties"]["spec"]["properties"]["additionalClientPorts"]["items"]
    port["properties"]["protocol"]["default"] = "TCP"
    subresources = {"status": {}}
    if resource.scale is not None:
        subresources["scale"] = {"specReplicasPath": ".spec.worker.replicas",
                                 "statusReplicasPath": ".status.workerReplicas",
                                 "labelSelectorPath": ".status.workerSelector"}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{resource.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": resource.kind, "plural": resource.plural, "shortNames": [resource.short_name]},
            "scope": "Namespaced",
            "versions": [{"name": VERSION, "served": True, "storage": True, "subresources": subresources,
                          "schema": {"openAPIV3Schema": schema}}],
        },
    }


def test_crd_compare_agrees_with_matching_crds_and_names_each_difference(tmp_path, capsys):
    crds = {plural: _published_crd(resource) for plural, resource in CUSTOM_RESOURCES.items()}
    for plural, crd in crds.items():
        (tmp_path / f"{plural}.yaml").write_text(yaml.safe_dump(crd), encoding="utf-8")
    assert crd_compare.main([str(tmp_path)]) == 0
    assert "4 CRD(s) compared: the facts agree" in capsys.readouterr().out

    ray = crds["rayclusters"]["spec"]["versions"][0]
    worker = ray["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["worker"]
    worker["properties"]["replicas"]["format"] = "int64"
    del ray["subresources"]["scale"]
    (tmp_path / "rayclusters.yaml").write_text(yaml.safe_dump(crds["rayclusters"]), encoding="utf-8")
    (tmp_path / "daskclusters.yaml").unlink()
    assert crd_compare.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert ("rayclusters: schema.properties.spec.properties.worker.properties.replicas.format: "
            "facts have 'int32', CRD has 'int64'") in out
    assert "rayclusters: scale subresource: facts have {'specReplicasPath'" in out
    assert "daskclusters: in the facts, but no CRD file for it" in out
    assert "3 difference(s)" in out
