"""Waiting on pods: watches that break or expire, pods that cannot start, timeouts, the HPA."""
import threading
import time

import pytest
from tests.servers.k8s_fixtures import backend, k8s, make_backend, tiers_file  # noqa: F401 - fixtures
from tests.servers.k8s_server import K8sTestServer

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.errors import ScalingTimeoutError, WorkerFailedError


def _pod_lists(server, watch):
    return sum(
        1 for r in server.requests
        if r.method == "GET" and r.path.endswith("/pods") and (r.query.get("watch") == "true") == watch
    )


def _in_background(fn):
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_wait_survives_dropped_watches(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1)
    k8s.set_ready_delay(1.5)
    thread, outcome = _in_background(lambda: backend.scale(ClusterRef("ray", "c1"), 3, timeout=30))
    dropped = 0
    for _ in range(3):
        k8s.wait_for(lambda: k8s._watches, 10, "a watch to open")
        dropped += k8s.drop_watches()
        time.sleep(0.1)
    thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["value"].final.ready_workers == 3
    assert dropped >= 3
    assert _pod_lists(k8s, watch=True) >= dropped


def test_wait_relists_after_410_gone(k8s, backend):  # noqa: F811
    k8s.add_cluster("dask", "d1", replicas=1)
    k8s.set_ready_delay(0.6)
    thread, outcome = _in_background(lambda: backend.scale(ClusterRef("dask", "d1"), 2, timeout=30))
    k8s.wait_for(lambda: k8s._watches, 10, "a watch to open")
    lists_before = _pod_lists(k8s, watch=False)
    # Drop first: the backend pauses before reconnecting, and by then its version is compacted away.
    k8s.drop_watches()
    k8s.compact()
    thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["value"].final.ready_workers == 2
    assert _pod_lists(k8s, watch=False) > lists_before


@pytest.mark.parametrize("reason", ["CrashLoopBackOff", "Unschedulable", "ImagePullBackOff", "ErrImagePull"])
def test_failing_worker_ends_the_wait_early(k8s, backend, reason):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=2)
    k8s.inject_fault("c1", reason, ordinals=[3])
    with pytest.raises(WorkerFailedError) as err:
        backend.scale(ClusterRef("ray", "c1"), 4, timeout=60)
    assert err.value.pod == "c1-ray-worker-3"
    assert err.value.reason == reason
    assert reason in str(err.value)
    assert err.value.state is not None and err.value.state.ready_workers == 3


def test_failure_within_grace_does_not_end_the_wait(k8s, tiers_file):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1)
    k8s.inject_fault("c1", "CrashLoopBackOff", ordinals=[1])
    with make_backend(k8s, tiers_file, failure_grace=30) as patient:
        thread, outcome = _in_background(lambda: patient.scale(ClusterRef("ray", "c1"), 2, timeout=30))
        k8s.wait_for(lambda: any(
            (p["status"]["containerStatuses"][0]["state"].get("waiting") or {}).get("reason") == "CrashLoopBackOff"
            for p in k8s.pods("c1", component="worker")), 10, "the crash loop")
        time.sleep(0.3)
        k8s.clear_faults("c1")
        thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["value"].final.ready_workers == 2


def test_timeout_carries_the_last_state(k8s, backend):  # noqa: F811
    k8s.add_cluster("spark", "s1", replicas=1)
    k8s.set_ready_delay(60)
    with pytest.raises(ScalingTimeoutError) as err:
        backend.scale(ClusterRef("spark", "s1"), 2, timeout=0.5)
    state = err.value.state
    assert state.desired_workers == 2 and state.existing_workers == 2 and state.ready_workers == 1
    assert "2 Ready workers" in str(err.value)


def test_timeout_names_pods_that_are_not_starting(k8s, tiers_file):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1)
    k8s.inject_fault("c1", "CrashLoopBackOff", ordinals=[1])
    with make_backend(k8s, tiers_file, failure_grace=30) as patient:
        with pytest.raises(ScalingTimeoutError) as err:
            patient.scale(ClusterRef("ray", "c1"), 2, timeout=0.5)
    assert "c1-ray-worker-1 CrashLoopBackOff" in str(err.value)


def test_wait_for_workers_reports_progress(k8s, backend):  # noqa: F811
    k8s.add_cluster("dask", "d1", replicas=2)
    seen = []
    state = backend.wait_for_workers(ClusterRef("dask", "d1"), 2, timeout=10, progress=seen.append)
    assert state.ready_workers == 2
    assert seen and seen[-1].current == 2 and seen[-1].target == 2 and "d1" in seen[-1].what


@pytest.fixture
def hpa_server():
    with K8sTestServer(ready_delay=0.02, hpa_window=0.3) as server:
        yield server


def test_scale_holds_against_the_hpa(hpa_server, tiers_file):  # noqa: F811
    hpa_server.add_cluster("ray", "c1", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 6})
    with make_backend(hpa_server, tiers_file) as held:
        held.scale(ClusterRef("ray", "c1"), 4, timeout=20)
        time.sleep(0.8)
        state = held.get_state(ClusterRef("ray", "c1"))
    assert state.desired_workers == 4 and state.ready_workers == 4 and state.autoscaling_min == 4
