"""Waiting on pods: watches that break or expire, pods that cannot start, timeouts, the HPA."""
import contextlib
import socket
import threading
import time

import pytest
from kubernetes import client as k8s_client
from tests.reliability.rel_proxy import FaultProxy
from tests.servers.k8s_fixtures import backend, k8s, make_backend, tiers_file  # noqa: F401 - fixtures
from tests.servers.k8s_server import K8sTestServer

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
from flytekitplugins_ddlscale.errors import ScalingTimeoutError, WorkerFailedError
from flytekitplugins_ddlscale.backends.tiers import FileTierCatalog


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
    # Every cut watch (of the pods, or of the cluster objects the wait's state reads come from) came back.
    assert sum(1 for r in k8s.requests if r.query.get("watch") == "true") >= dropped


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


@contextlib.contextmanager
def _hanging_backend(k8s, tiers_file, **options):  # noqa: F811
    """A backend whose API server can be made to hang (``proxy.hang()``): connections stay open, nothing answers."""
    with FaultProxy(("127.0.0.1", int(k8s.url.rsplit(":", 1)[1]))) as proxy:
        client = k8s_client.ApiClient(k8s_client.Configuration(host=proxy.url))
        instance = KubernetesBackend(
            api_client=client, tier_catalog=FileTierCatalog(tiers_file), failure_grace=30, **options
        )
        try:
            yield instance, proxy
        finally:
            proxy.hang(False)
            instance.close()
            client.close()


def _hang_after_first_report(proxy):
    def report(_progress):
        proxy.hang()

    return report


def test_a_scale_whose_server_hangs_mid_wait_times_out_with_the_last_state(k8s, tiers_file):  # noqa: F811
    k8s.add_cluster("ray", "c1", replicas=1)
    k8s.set_ready_delay(60)
    # request_timeout far above the wait's timeout: only the deadline can end the hung reads in time.
    with _hanging_backend(k8s, tiers_file, request_timeout=30) as (hanging, proxy):
        with pytest.raises(ScalingTimeoutError) as err:
            hanging.scale(ClusterRef("ray", "c1"), 3, timeout=1.0, progress=_hang_after_first_report(proxy))
    state = err.value.state
    assert state is not None and state.desired_workers == 3 and state.ready_workers == 1
    assert "3 Ready workers" in str(err.value) and "last error" in str(err.value)
    assert k8s.get_object("ray", "c1")["spec"]["worker"]["replicas"] == 3


def test_a_head_restart_whose_server_hangs_mid_wait_times_out(k8s, tiers_file):  # noqa: F811
    k8s.add_cluster("dask", "d1", replicas=1)
    k8s.set_ready_delay(60)
    with _hanging_backend(k8s, tiers_file, request_timeout=30) as (hanging, proxy):
        with pytest.raises(ScalingTimeoutError) as err:
            hanging.restart_head(ClusterRef("dask", "d1"), timeout=1.0, progress=_hang_after_first_report(proxy))
    assert err.value.state is not None and err.value.state.cluster == "domino-compute/dask/d1"
    assert "new Ready" in str(err.value)


def test_a_wait_on_a_server_that_never_answers_names_the_cluster(k8s, tiers_file):  # noqa: F811
    k8s.add_cluster("spark", "s1", replicas=1)
    with _hanging_backend(k8s, tiers_file, request_timeout=30) as (hanging, proxy):
        proxy.hang()
        with pytest.raises(ScalingTimeoutError) as err:
            hanging.wait_for_workers(ClusterRef("spark", "s1"), 2, timeout=0.5)
    assert err.value.state is None
    assert err.value.cluster == "domino-compute/spark/s1"
    assert "never read" in str(err.value)


class _SilentServer:
    """Accepts connections and reads requests on 127.0.0.1 but never answers; counts the requests."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.requests = 0
        self._stop = threading.Event()
        self._conns = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                conn.settimeout(0.05)
                self._conns.append(conn)
            except socket.timeout:
                pass
            for conn in list(self._conns):
                try:
                    data = conn.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._conns.remove(conn)
                    conn.close()
                self.requests += data.count(b" HTTP/1.1\r\n")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._conns:
            conn.close()
        self.sock.close()


def test_a_hung_read_is_not_resent_by_urllib3_past_the_deadline():
    server = _SilentServer()
    client = k8s_client.ApiClient(k8s_client.Configuration(host=server.url))
    hanging = KubernetesBackend(api_client=client, failure_grace=30, request_timeout=30)
    started = time.monotonic()
    try:
        with pytest.raises(ScalingTimeoutError):
            hanging.wait_for_workers(ClusterRef("ray", "c1"), 1, timeout=0.5)
        ended = time.monotonic() - started
    finally:
        hanging.close()
        client.close()
        server.close()
    # One list of the pods, cut at the deadline: neither the backend nor urllib3 sends it again.
    assert server.requests == 1
    # Not a speed limit: which timeout cut the read. The 30 s request_timeout would have taken 30 s or more.
    assert ended < 30
