"""The test API server enforces what a real API server and the DCO webhook enforce.

Requests here go straight through the official ``kubernetes`` client, not the
backend, so the server's own rules are checked independently.
"""
import copy
import json
import threading

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.servers.k8s_fixtures import k8s  # noqa: F401 - fixture
from tests.servers.k8s_server import K8sTestServer

GROUP, VERSION, NS = "distributed-compute.dominodatalab.com", "v1alpha1", "domino-compute"


@pytest.fixture
def apis(k8s):  # noqa: F811
    api_client = k8s.api_client()
    yield client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    api_client.close()


def _patch(custom, name, body, content_type="application/merge-patch+json", plural="rayclusters"):
    return custom.patch_namespaced_custom_object(GROUP, VERSION, NS, plural, name, body, _content_type=content_type)


def _message(exc: ApiException) -> str:
    return json.loads(exc.body)["message"]


def test_strategic_merge_patch_on_custom_resource_is_415(k8s, apis):  # noqa: F811
    k8s.add_cluster("ray", "c1")
    custom, _ = apis
    with pytest.raises(ApiException) as err:
        _patch(custom, "c1", {"spec": {"worker": {"replicas": 3}}}, "application/strategic-merge-patch+json")
    assert err.value.status == 415
    assert "application/merge-patch+json" in _message(err.value)
    assert k8s.get_object("ray", "c1")["spec"]["worker"]["replicas"] == 2


def test_merge_and_json_patch_are_accepted(k8s, apis):  # noqa: F811
    k8s.add_cluster("dask", "d1")
    custom, _ = apis
    _patch(custom, "d1", {"spec": {"worker": {"replicas": 3}}}, plural="daskclusters")
    ops = [{"op": "test", "path": "/spec/worker/replicas", "value": 3},
           {"op": "replace", "path": "/spec/worker/replicas", "value": 1}]
    _patch(custom, "d1", ops, "application/json-patch+json", plural="daskclusters")
    assert k8s.get_object("dask", "d1")["spec"]["worker"]["replicas"] == 1
    with pytest.raises(ApiException) as err:
        _patch(custom, "d1", [{"op": "test", "path": "/spec/worker/replicas", "value": 7}],
               "application/json-patch+json", plural="daskclusters")
    assert err.value.status == 422


def test_schema_validation_and_pruning(k8s, apis):  # noqa: F811
    k8s.add_cluster("ray", "c1")
    custom, _ = apis
    with pytest.raises(ApiException) as err:
        _patch(custom, "c1", {"spec": {"worker": {"replicas": "three"}}})
    assert err.value.status == 422 and "spec.worker.replicas" in _message(err.value)
    # Unknown fields are dropped, as a structural schema makes a real server do.
    after = _patch(custom, "c1", {"spec": {"worker": {"replicaz": 5}}})
    assert "replicaz" not in after["spec"]["worker"]
    with pytest.raises(Exception):
        k8s.add_cluster("mpi", "m-bad", replicas=1, wait_ready=False, worker_resources={"requests": {"cpu": 1}})


@pytest.mark.parametrize(
    "patch, fragment",
    [
        ({"spec": {"autoscaling": {"minReplicas": 0}}}, "minReplicas"),
        ({"spec": {"autoscaling": {"minReplicas": 6}}}, "cannot be greater than maxReplicas"),
        ({"spec": {"worker": {"resources": {"requests": {"memory": None}}}}}, "requests.memory"),
    ],
)
def test_webhook_rules(k8s, apis, patch, fragment):  # noqa: F811
    k8s.add_cluster("ray", "c1", autoscaling={"minReplicas": 1, "maxReplicas": 5})
    before = k8s.get_object("ray", "c1")
    custom, _ = apis
    with pytest.raises(ApiException) as err:
        _patch(custom, "c1", patch)
    assert err.value.status == 422
    assert "admission webhook" in _message(err.value) and fragment in _message(err.value)
    assert k8s.get_object("ray", "c1") == before


def test_negative_replicas_are_refused_by_the_scale_subresource_check_not_the_webhook(k8s, apis):  # noqa: F811
    k8s.add_cluster("ray", "c1")
    custom, _ = apis
    with pytest.raises(ApiException) as err:
        _patch(custom, "c1", {"spec": {"worker": {"replicas": -1}}})
    assert err.value.status == 422
    assert _message(err.value) == (
        'RayCluster.distributed-compute.dominodatalab.com "c1" is invalid: '
        ".spec.worker.replicas: Invalid value: -1: should be a non-negative integer"
    )


def test_stale_resource_version_is_409(k8s, apis):  # noqa: F811
    k8s.add_cluster("spark", "s1")
    custom, _ = apis
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NS, "sparkclusters", "s1")
    rv = obj["metadata"]["resourceVersion"]
    _patch(custom, "s1", {"metadata": {"resourceVersion": rv}, "spec": {"worker": {"replicas": 3}}}, plural="sparkclusters")
    with pytest.raises(ApiException) as err:
        _patch(custom, "s1", {"metadata": {"resourceVersion": rv}, "spec": {"worker": {"replicas": 1}}},
               plural="sparkclusters")
    assert err.value.status == 409
    obj.pop("status", None)
    obj["metadata"].pop("resourceVersion")
    with pytest.raises(ApiException) as err:
        custom.replace_namespaced_custom_object(GROUP, VERSION, NS, "sparkclusters", "s1", obj)
    assert err.value.status == 422


def test_not_found_and_forbidden(k8s, apis):  # noqa: F811
    k8s.add_cluster("ray", "c1")
    custom, core = apis
    with pytest.raises(ApiException) as err:
        custom.get_namespaced_custom_object(GROUP, VERSION, NS, "rayclusters", "nope")
    assert err.value.status == 404
    k8s.forbid("delete", "pods")
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_pod("c1-ray-head-0", NS)
    assert err.value.status == 403
    assert 'cannot delete resource "pods"' in _message(err.value)


def test_label_selector_and_watch_from_resource_version(k8s, apis):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=2)
    k8s.add_cluster("dask", "c1", replicas=1)
    custom, core = apis
    listed = core.list_namespaced_pod(
        NS, label_selector="app.kubernetes.io/name=ray,app.kubernetes.io/component in (worker)"
    )
    assert sorted(p.metadata.name for p in listed.items) == ["c1-ray-worker-0", "c1-ray-worker-1"]
    version = listed.metadata.resource_version
    _patch(custom, "c1", {"spec": {"worker": {"replicas": 3}}})
    response = core.list_namespaced_pod(
        NS, label_selector="app.kubernetes.io/name=ray,app.kubernetes.io/component=worker", watch=True,
        resource_version=version, timeout_seconds=1, _preload_content=False,
    )
    events = [json.loads(line) for line in response.read().decode().splitlines() if line]
    names = {e["object"]["metadata"]["name"] for e in events}
    assert names == {"c1-ray-worker-2"}
    assert {e["type"] for e in events} <= {"ADDED", "MODIFIED"}


def test_watch_from_compacted_version_gets_410(k8s, apis):  # noqa: F811
    k8s.add_cluster("ray", "c1")
    _, core = apis
    version = core.list_namespaced_pod(NS).metadata.resource_version
    k8s.compact()
    response = core.list_namespaced_pod(NS, watch=True, resource_version=version, timeout_seconds=1,
                                        _preload_content=False)
    events = [json.loads(line) for line in response.read().decode().splitlines() if line]
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


def _marked(server, pod_name: str, marker: str) -> None:
    # Under the server's lock: a change of the pod only a watch can report.
    pod = copy.deepcopy(server.lookup("pods", NS, pod_name))
    pod["metadata"].setdefault("annotations", {})["test.example.com/marker"] = marker
    server.commit("pods", NS, pod, pod_name, "MODIFIED")


def _markers(events) -> list:
    return [(e["object"]["metadata"].get("annotations") or {}).get("test.example.com/marker")
            for e in events if e["type"] != "ERROR"]


def _watched_until(response, last_marker: str) -> list:
    """The stream's events up to the one carrying ``last_marker`` (or its end: the request's timeout
    bounds the wait)."""
    events, buffered = [], b""
    for chunk in response.stream(1024, decode_content=False):
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        events += [json.loads(line) for line in lines if line]
        if last_marker in _markers(events):
            break
    return events


def test_a_running_watch_gets_the_events_committed_before_a_compaction(k8s, apis):  # noqa: F811
    """A compaction ends no running watch and cuts nothing it has still to send (the API server's watch
    cache sends it); only a watch opened later from an earlier version gets 410."""
    k8s.add_cluster("ray", "c1")
    k8s.wait_for(lambda: k8s.pods("c1"), 5, "the cluster's pods")
    pod_name = k8s.pods("c1")[0]["metadata"]["name"]
    _, core = apis
    version = core.list_namespaced_pod(NS).metadata.resource_version
    response = core.list_namespaced_pod(NS, watch=True, resource_version=version, timeout_seconds=10,
                                        _preload_content=False)
    k8s.wait_for(lambda: k8s.open_watches_of("pods") == 1, 5, "the watch to open")
    with k8s.changed:  # the change and the compaction land before the watch can send anything
        _marked(k8s, pod_name, "before-compaction")
        k8s.compact()
        _marked(k8s, pod_name, "after-compaction")
    markers = _markers(_watched_until(response, "after-compaction"))
    assert markers[-2:] == ["before-compaction", "after-compaction"]
    response.release_conn()


def test_a_watch_the_history_window_passes_by_is_closed_not_skipped():
    """A watch that has not sent events the history window has since dropped is closed (the API server
    closes a watcher that falls behind); resuming from its last version then gets 410."""
    with K8sTestServer(history_limit=2) as server:
        server.add_cluster("ray", "c1")
        server.wait_for(lambda: server.pods("c1"), 5, "the cluster's pods")
        pod_name = server.pods("c1")[0]["metadata"]["name"]
        api_client = server.api_client()
        core = client.CoreV1Api(api_client)
        version = core.list_namespaced_pod(NS).metadata.resource_version
        response = core.list_namespaced_pod(NS, watch=True, resource_version=version, timeout_seconds=10,
                                            _preload_content=False)
        server.wait_for(lambda: server.open_watches_of("pods") == 1, 5, "the watch to open")
        with server.changed:
            for step in range(4):
                _marked(server, pod_name, f"step-{step}")
        assert response.read() == b""  # ended at once, in order: nothing skipped silently
        resumed = core.list_namespaced_pod(NS, watch=True, resource_version=version, timeout_seconds=1,
                                           _preload_content=False)
        events = [json.loads(line) for line in resumed.read().decode().splitlines() if line]
        assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410
        api_client.close()


def test_operator_recreates_head_with_new_uid(k8s, apis):  # noqa: F811
    k8s.add_cluster("spark", "s1")
    _, core = apis
    head = k8s.pods("s1", component="master")[0]
    core.delete_namespaced_pod(head["metadata"]["name"], NS)
    k8s.wait_for(
        lambda: any(p["metadata"]["uid"] != head["metadata"]["uid"] and p["status"]["phase"] == "Running"
                    for p in k8s.pods("s1", component="master")),
        5, "a new master pod",
    )
    assert k8s.get_object("spark", "s1")["status"]["clusterStatus"] == "Running"


def test_hpa_pulls_replicas_back_to_min(apis_server_with_hpa):
    server, custom = apis_server_with_hpa
    _patch(custom, "c1", {"spec": {"worker": {"replicas": 4}}})
    server.wait_for(lambda: server.get_object("ray", "c1")["spec"]["worker"]["replicas"] == 1, 5, "HPA scale-down")
    server.wait_for(lambda: server.ready_workers("c1") == 1, 5, "one worker")


@pytest.fixture
def apis_server_with_hpa():
    with K8sTestServer(ready_delay=0.01, hpa_window=0.2) as server:
        server.add_cluster("ray", "c1", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 5})
        api_client = server.api_client()
        yield server, client.CustomObjectsApi(api_client)
        api_client.close()


def test_server_closes_cleanly_with_open_watch():
    server = K8sTestServer().start()
    server.add_cluster("ray", "c1")
    api_client = server.api_client()
    core = client.CoreV1Api(api_client)
    response = core.list_namespaced_pod(NS, watch=True, timeout_seconds=30, _preload_content=False)
    before = threading.active_count()
    server.close()
    response.release_conn()
    api_client.close()
    assert threading.active_count() <= before
