"""The phase monitor never re-adds a claim after its phase has ended, even when a read hangs."""
import threading
import time

from flytekitplugins_ddlscale._services.hold.monitor import PhaseMonitor
from flytekitplugins_ddlscale.refs import ClusterRef
from flytekitplugins_ddlscale._core.timeline import WorkerTimeline


def _wait_for_thread_end(name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(t.name == name for t in threading.enumerate()):
        assert time.monotonic() < deadline, f"thread {name} still running after {timeout}s"
        time.sleep(0.02)


def test_a_read_in_flight_when_the_phase_ends_does_not_re_add_the_claim(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "mon", replicas=1, max_replicas=4)
    ref = ClusterRef("ray", "mon")
    scaler_backend.claim(ref, "phase-a", 3)
    scaler_backend.reconcile(ref, wait=False)
    scaler_server.clear_requests()
    scaler_server.inject_faults("delay", count=1, delay=1.0, method="GET", path="/cluster/")

    monitor = PhaseMonitor(scaler_backend, ref, "phase-a", 90.0, WorkerTimeline(), sample_interval=0.05)
    monitor.start()
    monitor.watch(3, reassert_interval=0.05)
    try:
        deadline = time.monotonic() + 5
        while scaler_server.count("GET", "/cluster/rayclusters/mon") == 0:
            assert time.monotonic() < deadline, "the monitor never read the cluster"
            time.sleep(0.01)
        monitor.stop(timeout=0.1)  # the delayed read is still in flight
        assert scaler_backend.release(ref, "phase-a") is None
    finally:
        monitor.stop(timeout=5)
        _wait_for_thread_end("ddlscale-phase-mon", timeout=5)
    assert scaler_backend.claims(ref) == {}
