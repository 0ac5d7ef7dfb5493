"""The API server's own rules, on the test server and on a real kube-apiserver alike.

Raw requests through the official client (not the backend): patch media
types, schema validation and pruning from the repository's CRD facts,
resourceVersion conflicts, label-selected watches from a version, 410 Gone.
"""
import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION

MERGE, JSON_PATCH, STRATEGIC = (
    "application/merge-patch+json", "application/json-patch+json", "application/strategic-merge-patch+json",
)


def _patch(side, name, body, content_type=MERGE, plural="rayclusters"):
    custom = client.CustomObjectsApi(side.admin_client())
    return custom.patch_namespaced_custom_object(
        CRD_GROUP, CRD_VERSION, side.namespace, plural, name, body, _content_type=content_type)


def _message(exc: ApiException) -> str:
    return json.loads(exc.body)["message"]


def test_merge_and_json_patch_are_accepted_and_strategic_merge_is_415(side):
    side.add_cluster("ray", "c1", replicas=1, wait_ready=False)
    assert _patch(side, "c1", {"spec": {"worker": {"replicas": 2}}})["spec"]["worker"]["replicas"] == 2
    ops = [{"op": "test", "path": "/spec/worker/replicas", "value": 2},
           {"op": "replace", "path": "/spec/worker/replicas", "value": 3}]
    assert _patch(side, "c1", ops, JSON_PATCH)["spec"]["worker"]["replicas"] == 3
    with pytest.raises(ApiException) as failed_test:
        _patch(side, "c1", [{"op": "test", "path": "/spec/worker/replicas", "value": 7}], JSON_PATCH)
    assert failed_test.value.status == 422
    with pytest.raises(ApiException) as strategic:
        _patch(side, "c1", {"spec": {"worker": {"replicas": 1}}}, STRATEGIC)
    assert strategic.value.status == 415
    assert MERGE in _message(strategic.value)
    assert side.get_object("ray", "c1")["spec"]["worker"]["replicas"] == 3


@pytest.mark.parametrize(
    "body, field, reason, words",
    [
        ({"spec": {"worker": {"replicas": "three"}}}, "spec.worker.replicas", "FieldValueTypeInvalid",
         'Invalid value: "string": spec.worker.replicas in body must be of type integer: "string"'),
        ({"spec": {"autoscaling": {"minReplicas": 1}}}, "spec.autoscaling.maxReplicas", "FieldValueRequired",
         "Required value"),
        ({"spec": {"worker": {"resources": {"requests": {"cpu": "lots"}}}}}, "spec.worker.resources.requests.cpu",
         "FieldValueInvalid", 'Invalid value: "lots": spec.worker.resources.requests.cpu in body should match \'^'),
        ({"spec": {"worker": {"labels": {"dominodatalab.com/hardware-tier-id": 7}}}},
         "spec.worker.labels.dominodatalab.com/hardware-tier-id", "FieldValueTypeInvalid",
         "in body must be of type string"),
    ],
)
def test_the_crd_schema_refuses_bad_fields_with_422_naming_them(side, body, field, reason, words):
    side.add_cluster("ray", "c1", replicas=1, wait_ready=False)
    with pytest.raises(ApiException) as caught:
        _patch(side, "c1", body)
    assert caught.value.status == 422
    status = json.loads(caught.value.body)
    assert status["reason"] == "Invalid"
    assert status["message"].startswith('RayCluster.distributed-compute.dominodatalab.com "c1" is invalid: ')
    assert f"{field}: " in status["message"] and words in status["message"]
    cause = next(c for c in status["details"]["causes"] if c["field"] == field)
    assert cause["reason"] == reason and words in cause["message"]
    assert side.get_object("ray", "c1")["spec"]["worker"]["replicas"] == 1


@pytest.mark.parametrize(
    "patch, fragment",
    [
        ({"spec": {"autoscaling": {"minReplicas": 0}}}, "spec.autoscaling.minReplicas: Invalid value: 0"),
        ({"spec": {"autoscaling": {"minReplicas": 6}}}, "cannot be greater than maxReplicas (5)"),
        ({"spec": {"worker": {"resources": {"requests": {"memory": None}}}}}, "requests.memory: Required value"),
    ],
)
def test_the_operator_webhook_refusal_reaches_the_client_as_422(side, patch, fragment):
    side.add_cluster("ray", "c1", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 5}, wait_ready=False)
    before = side.get_object("ray", "c1")["spec"]
    with pytest.raises(ApiException) as caught:
        _patch(side, "c1", patch)
    status = json.loads(caught.value.body)
    assert (caught.value.status, status["reason"]) == (422, "Invalid")
    assert status["message"].startswith(
        'admission webhook "vraycluster.distributed-compute.dominodatalab.com" denied the request: '
        'RayCluster.distributed-compute.dominodatalab.com "c1" is invalid: ')
    assert fragment in status["message"]
    assert side.get_object("ray", "c1")["spec"] == before


@pytest.mark.parametrize(
    "replicas, words",
    [
        (-1, ".spec.worker.replicas: Invalid value: -1: should be a non-negative integer"),
        ("three", ".spec.worker.replicas: Invalid value: 0: .spec.worker.replicas accessor error: three is of the "
                  "type string, expected int64"),
    ],
)
def test_the_scale_subresource_path_is_checked_by_the_api_server_before_any_webhook(side, replicas, words):
    side.add_cluster("dask", "d1", replicas=1, wait_ready=False)
    with pytest.raises(ApiException) as caught:
        _patch(side, "d1", {"spec": {"worker": {"replicas": replicas}}}, plural="daskclusters")
    status = json.loads(caught.value.body)
    assert (caught.value.status, status["reason"]) == (422, "Invalid")
    assert "admission webhook" not in status["message"] and words in status["message"]
    assert any(c["field"] == ".spec.worker.replicas" for c in status["details"]["causes"])
    assert side.get_object("dask", "d1")["spec"]["worker"]["replicas"] == 1


def test_unknown_fields_are_pruned_and_maps_kept(side):
    side.add_cluster("dask", "d1", replicas=1, wait_ready=False)
    after = _patch(side, "d1", {"spec": {"worker": {"replicaz": 5, "nodeSelector": {"pool": "a"}}, "bogus": 1}},
                   plural="daskclusters")
    assert "replicaz" not in after["spec"]["worker"] and "bogus" not in after["spec"]
    assert after["spec"]["worker"]["nodeSelector"] == {"pool": "a"}


def test_a_stale_resource_version_is_409(side):
    side.add_cluster("spark", "s1", replicas=1, wait_ready=False)
    # The operator writes the status meanwhile on both servers: retry the first patch (bounded) until
    # it carries the current version.
    for _ in range(20):
        rv = side.get_object("spark", "s1")["metadata"]["resourceVersion"]
        try:
            _patch(side, "s1", {"metadata": {"resourceVersion": rv}, "spec": {"worker": {"replicas": 2}}},
                   plural="sparkclusters")
            break
        except ApiException as exc:
            assert exc.status == 409
    else:
        raise AssertionError("20 patches with a freshly read resourceVersion all got 409")
    with pytest.raises(ApiException) as caught:
        _patch(side, "s1", {"metadata": {"resourceVersion": rv}, "spec": {"worker": {"replicas": 3}}},
               plural="sparkclusters")
    assert caught.value.status == 409
    assert "the object has been modified" in _message(caught.value)
    assert side.get_object("spark", "s1")["spec"]["worker"]["replicas"] == 2


def test_a_label_selected_watch_from_a_version_sees_only_what_came_after(side):
    side.add_cluster("ray", "c1", replicas=1)
    core = client.CoreV1Api(side.admin_client())
    selector = "app.kubernetes.io/instance=c1,app.kubernetes.io/component in (worker)"
    listed = core.list_namespaced_pod(side.namespace, label_selector=selector)
    assert [p.metadata.name for p in listed.items] == ["c1-ray-worker-0"]
    _patch(side, "c1", {"spec": {"worker": {"replicas": 2}}})
    side.wait_for(lambda: side.ready_workers("c1") == 2, "the second worker")
    response = core.list_namespaced_pod(
        side.namespace, label_selector=selector, watch=True, resource_version=listed.metadata.resource_version,
        timeout_seconds=1, _preload_content=False,
    )
    events = [json.loads(line) for line in response.read().decode().splitlines() if line]
    assert {e["object"]["metadata"]["name"] for e in events} == {"c1-ray-worker-1"}
    assert events[0]["type"] == "ADDED" and {e["type"] for e in events} <= {"ADDED", "MODIFIED"}


def test_a_watch_from_a_compacted_version_gets_410(side):
    side.add_cluster("ray", "c1", replicas=1)
    core = client.CoreV1Api(side.admin_client())
    version = core.list_namespaced_pod(side.namespace).metadata.resource_version
    _patch(side, "c1", {"spec": {"worker": {"replicas": 2}}})
    side.wait_for(lambda: side.ready_workers("c1") == 2, "the second worker")
    side.compact()
    response = core.list_namespaced_pod(side.namespace, watch=True, resource_version=version, timeout_seconds=1,
                                        _preload_content=False)
    events = [json.loads(line) for line in response.read().decode().splitlines() if line]
    assert events and events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"
    assert "too old" in events[0]["object"]["message"]
