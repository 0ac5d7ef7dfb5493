"""The test server speaks the scaler service's protocol (docs/scaler.md), route by route.

These pin the fake to that contract so backend tests cannot pass against
rules the real service does not have.
"""
import time

import httpx
import pytest

from tests.servers.scaler_server import (
    ADMIN_API_KEY,
    DEFAULT_API_KEY,
    DEFAULT_TOKEN,
    OTHER_API_KEY,
)

KEY = {"X-Domino-Api-Key": DEFAULT_API_KEY}


@pytest.fixture
def http(scaler_server):
    with httpx.Client(base_url=scaler_server.url, timeout=5) as client:
        yield client


def test_healthz(http):
    response = http.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "healthy"}


def test_list_filters_to_visible_clusters_and_validates_kind(scaler_server, http):
    scaler_server.add_cluster("ray", "ray-a")
    scaler_server.add_cluster("ray", "ray-b", owner="someone-else")
    mine = http.get("/ddl_cluster_scaler/list/rayclusters", headers=KEY).json()
    assert mine["count"] == 1 and mine["clusters"][0]["metadata"]["name"] == "ray-a"
    admin = http.get("/ddl_cluster_scaler/list/rayclusters", headers={"X-Domino-Api-Key": ADMIN_API_KEY}).json()
    assert admin["count"] == 2
    bad = http.get("/ddl_cluster_scaler/list/mpiclusters", headers=KEY)
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_kind"


def test_get_cluster_object_and_errors(scaler_server, http):
    scaler_server.add_cluster("spark", "spark-a", replicas=2, max_replicas=5, min_replicas=1)
    obj = http.get("/ddl_cluster_scaler/cluster/sparkclusters/spark-a", headers=KEY).json()
    assert obj["kind"] == "SparkCluster"
    assert obj["spec"]["worker"]["replicas"] == 2
    assert obj["spec"]["autoscaling"] == {"maxReplicas": 5, "minReplicas": 1}
    assert obj["status"]["nodes"] == [
        "spark-a-spark-master-0",
        "spark-a-spark-worker-0",
        "spark-a-spark-worker-1",
    ]
    assert obj["status"]["clusterStatus"] == "Running"
    missing = http.get("/ddl_cluster_scaler/cluster/sparkclusters/nope", headers=KEY)
    assert missing.status_code == 500 and missing.json()["error"] == "get_failed"
    assert "(404)" in missing.json()["details"]
    other = http.get("/ddl_cluster_scaler/cluster/sparkclusters/spark-a", headers={"X-Domino-Api-Key": OTHER_API_KEY})
    assert other.status_code == 403 and other.json()["error"] == "unauthorized"
    anonymous = http.get("/ddl_cluster_scaler/cluster/sparkclusters/spark-a")
    assert anonymous.status_code == 403
    bearer = http.get(
        "/ddl_cluster_scaler/cluster/sparkclusters/spark-a", headers={"Authorization": f"Bearer {DEFAULT_TOKEN}"}
    )
    assert bearer.status_code == 200
    assert http.get("/ddl_cluster_scaler/cluster/foo/spark-a", headers=KEY).json()["error"] == "invalid_kind"


def test_api_key_wins_over_bearer_like_the_service(scaler_server, http):
    scaler_server.add_cluster("ray", "ray-a")
    both = {"X-Domino-Api-Key": OTHER_API_KEY, "Authorization": f"Bearer {DEFAULT_TOKEN}"}
    assert http.get("/ddl_cluster_scaler/cluster/rayclusters/ray-a", headers=both).status_code == 403


@pytest.mark.parametrize("replicas", [-1, "x", None, [1]])
def test_scale_bad_request(scaler_server, http, replicas):
    scaler_server.add_cluster("ray", "ray-a")
    response = http.patch("/ddl_cluster_scaler/scale/rayclusters/ray-a", json={"replicas": replicas}, headers=KEY)
    assert response.status_code == 400 and response.json()["error"] == "bad_request"


def test_scale_parses_replicas_like_the_service_and_caps(scaler_server, http):
    scaler_server.add_cluster("ray", "ray-a", replicas=1, max_replicas=3)
    ok = http.patch("/ddl_cluster_scaler/scale/rayclusters/ray-a", json={"replicas": "2"}, headers=KEY).json()
    assert ok["effective_replicas"] == 2 and ok["capped"] is False
    capped = http.patch("/ddl_cluster_scaler/scale/rayclusters/ray-a", json={"replicas": 7}, headers=KEY).json()
    assert (capped["requested_replicas"], capped["effective_replicas"], capped["capped"]) == (7, 3, True)
    assert capped["maxReplicas"] == 3
    assert capped["object"]["spec"]["worker"]["replicas"] == 3
    assert capped["object"]["spec"]["autoscaling"]["maxReplicas"] == 3


def test_scale_conflicts_and_authorization(scaler_server, http):
    scaler_server.add_cluster("dask", "dask-a", max_replicas=None)
    scaler_server.add_cluster("dask", "dask-b", autoscaling={"minReplicas": 1})
    scaler_server.add_cluster("dask", "dask-c", owner="someone-else")
    url = "/ddl_cluster_scaler/scale/daskclusters/"
    assert http.patch(url + "dask-a", json={"replicas": 1}, headers=KEY).json()["error"] == "not_scalable"
    invalid = http.patch(url + "dask-b", json={"replicas": 1}, headers=KEY)
    assert invalid.status_code == 409 and invalid.json()["error"] == "invalid_autoscaling"
    assert http.patch(url + "dask-c", json={"replicas": 1}, headers=KEY).status_code == 403
    admin = http.patch(url + "dask-c", json={"replicas": 1}, headers={"X-Domino-Api-Key": ADMIN_API_KEY})
    assert admin.status_code == 200
    missing = http.patch(url + "nope", json={"replicas": 1}, headers=KEY)
    assert missing.status_code == 500 and missing.json()["error"] == "scale_failed"


def test_scale_tier_by_name_only_under_worker_hw_tier_name(scaler_server, http):
    scaler_server.add_cluster("ray", "ray-a")
    url = "/ddl_cluster_scaler/scale/rayclusters/ray-a"
    ignored = http.patch(url, json={"replicas": 1, "worker_hw_tier": "GPU", "worker_hw_tier_id": "GPU"}, headers=KEY)
    assert ignored.json()["worker_hw_tier_id"] is None
    applied = http.patch(url, json={"replicas": 1, "worker_hw_tier_name": "GPU"}, headers=KEY).json()
    worker = applied["object"]["spec"]["worker"]
    assert applied["worker_hw_tier_id"]["id"] == "gpu-k8s"
    assert worker["labels"]["dominodatalab.com/hardware-tier-id"] == "gpu-k8s"
    assert worker["nodeSelector"]["dominodatalab.com/node-pool"] == "gpu"
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == 1
    unknown = http.patch(url, json={"replicas": 1, "worker_hw_tier_name": "Huge"}, headers=KEY)
    assert unknown.status_code == 400 and unknown.json()["error"] == "invalid_hw_tier"
    restricted = http.patch(url, json={"replicas": 1, "worker_hw_tier_name": "Spark Only"}, headers=KEY)
    assert restricted.status_code == 400 and "restricted" in restricted.json()["message"]


def test_worker_pods_appear_and_leave_after_the_delay(scaler_server, http):
    scaler_server.add_cluster("ray", "ray-a", replicas=1, pod_ready_delay=0.4)
    url = "/ddl_cluster_scaler/cluster/rayclusters/ray-a"
    http.patch("/ddl_cluster_scaler/scale/rayclusters/ray-a", json={"replicas": 3}, headers=KEY)
    assert len(http.get(url, headers=KEY).json()["status"]["nodes"]) == 2
    time.sleep(0.5)
    assert len(http.get(url, headers=KEY).json()["status"]["nodes"]) == 4
    http.patch("/ddl_cluster_scaler/scale/rayclusters/ray-a", json={"replicas": 0}, headers=KEY)
    assert len(http.get(url, headers=KEY).json()["status"]["nodes"]) == 4
    time.sleep(0.5)
    assert http.get(url, headers=KEY).json()["status"]["nodes"] == ["ray-a-ray-head-0"]


def test_restart_head_ray_and_status_semantics(scaler_server, http):
    scaler_server.head_recreate_delay = 0.3
    scaler_server.head_ready_delay = 2.0  # a window wide enough to see "not ready" on a busy machine
    scaler_server.add_cluster("ray", "ray-a")
    status_url = "/ddl_cluster_scaler/restart_head_status/rayclusters/ray-a"
    assert http.get(status_url, headers=KEY).json()["error"] == "bad_request"
    assert http.get(status_url, params={"started_at": "yesterday"}, headers=KEY).status_code == 400
    restart = http.patch("/ddl_cluster_scaler/restart_head/rayclusters/ray-a", headers=KEY)
    assert restart.status_code == 202
    body = restart.json()
    assert body["pod"] == "ray-a-ray-head-0" and body["grace_period_seconds"] == 20
    assert body["started_at"].endswith("Z") and len(body["started_at"]) == 20

    def status():
        return http.get(status_url, params={"started_at": body["started_at"]}, headers=KEY)

    gone = status()
    assert gone.status_code == 404 and gone.json()["status"] == "head_pod_not_found"
    starting = _poll(status, lambda answer: answer.status_code != 404).json()
    assert starting["status"] == "restarted_but_not_ready" and starting["restarted"] and not starting["ready"]
    done = _poll(status, lambda answer: answer.json()["status"] != "restarted_but_not_ready").json()
    assert done["status"] == "restarted_and_ready" and done["ok"]
    future = http.get(status_url, params={"started_at": "2999-01-01T00:00:00Z"}, headers=KEY).json()
    assert future["status"] == "not_restarted"


def _poll(read, changed, timeout=20.0):
    """``read()`` every 50 ms until ``changed(answer)``; the answer (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = read()
        if changed(answer):
            return answer
        assert time.monotonic() < deadline, f"no change within {timeout}s: {answer.text}"
        time.sleep(0.05)


@pytest.mark.parametrize("kind,wrong", [("spark", "spark-a-spark-head-0"), ("dask", "dask-a-dask-head-0")])
def test_restart_head_name_defect_for_spark_and_dask(scaler_server, http, kind, wrong):
    scaler_server.add_cluster(kind, f"{kind}-a")
    response = http.patch(f"/ddl_cluster_scaler/restart_head/{kind}clusters/{kind}-a", headers=KEY)
    assert response.status_code == 404
    assert response.json() == {"ok": False, "error": "NotFound", "namespace": "domino-compute", "pod": wrong}


def test_proxy_tokens_expire(scaler_server, http):
    scaler_server.add_cluster("ray", "ray-a")
    token = http.get("/access-token").text
    url = "/ddl_cluster_scaler/cluster/rayclusters/ray-a"
    assert http.get(url, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    scaler_server.expire_tokens()
    assert http.get(url, headers={"Authorization": f"Bearer {token}"}).status_code == 403
    assert http.get("/v4/hardwareTier", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    principal = http.get("/v4/auth/principal", headers=KEY).json()
    assert principal["canonicalId"] == "owner-1" and principal["isAdmin"] is False


def test_fault_injection_and_request_log(scaler_server, http):
    scaler_server.add_cluster("ray", "ray-a")
    url = "/ddl_cluster_scaler/cluster/rayclusters/ray-a"
    scaler_server.inject_faults("status", count=2, status=502)
    assert [http.get(url, headers=KEY).status_code for _ in range(3)] == [502, 502, 200]
    scaler_server.inject_faults("drop", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        http.get(url, headers=KEY)
    scaler_server.inject_faults("delay", count=1, delay=1.0)
    with pytest.raises(httpx.ReadTimeout):
        http.get(url, headers=KEY, timeout=0.2)
    assert scaler_server.count("GET", "/cluster/") == 5
    assert [r.status for r in scaler_server.requests] == [502, 502, 200, None, None]
    assert scaler_server.requests[0].headers["x-domino-api-key"] == DEFAULT_API_KEY
    scaler_server.clear_requests()
    assert scaler_server.requests == []
