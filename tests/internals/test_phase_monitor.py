"""The phase monitor never re-adds a claim after its phase has ended, even when a read hangs; a holder
stopped after its request was written counts the stop against its lease."""
import threading
import time
from typing import Callable, Optional

import pytest

from flytekitplugins_ddlscale._core.leases import read_clocks
from flytekitplugins_ddlscale._core.records import Claim
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

    monitor = PhaseMonitor(scaler_backend, ref, Claim("phase-a", 3, lease_seconds=90.0), WorkerTimeline())
    monitor.start()
    monitor.watch(3, reassert_interval=0.05, sample_interval=0.05)
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


LEASE = 3.0
"""A short lease (renewed every second), so a stand-in stop outlives it within a few seconds."""


def _until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never saw {what} within {timeout}s"
        time.sleep(0.02)


def _drop_lapsed(backend, ref: ClusterRef) -> None:
    """Another phase comes and goes: its claim drops every lapsed claim from the record, as in the field."""
    _until("the stopped holder's claim lapse", lambda: backend.claims(ref) == {})
    backend.claim(ref, "other", 1)
    backend.release(ref, "other")


class HeldFirstRenewal:
    """The real backend, whose first renewal is held until :attr:`resume` is set: after it was written
    (its caller stopped, as by SIGSTOP, before handling the answer), or before it reaches the record
    (a slow request: an outage ridden out). :attr:`held` is set once it is held."""

    def __init__(self, backend, after_write: bool) -> None:
        self._backend = backend
        self._after_write = after_write
        self.held = threading.Event()
        self.resume = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    def renew(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        if self.held.is_set():
            return self._backend.renew(ref, claim_id)
        written = self._backend.renew(ref, claim_id) if self._after_write else None
        self.held.set()
        assert self.resume.wait(60), "the test never resumed the held renewal"
        return written if self._after_write else self._backend.renew(ref, claim_id)


def _reclaimed_or_given_up(monitor: PhaseMonitor, backend, ref: ClusterRef) -> None:
    """Wait for the monitor's verdict on its dropped claim: claimed again, or reported as dropped on time
    (which it never claims again, so the verdict stays)."""
    _until("the monitor claim again or give its claim up",
           lambda: "phase-a" in backend.claims(ref) or (monitor.lost or "").endswith("ends every phase)"))
    assert monitor.lost is None, monitor.lost
    assert backend.claims(ref)["phase-a"].replicas == 3


@pytest.mark.parametrize("after_write", [True, False], ids=["stopped-after-the-write", "slow-request"])
def test_a_renewal_held_past_the_lease_counts_the_hold(scaler_server, scaler_backend, after_write):
    """The holder's first renewal is held past its lease (the holder stopped after the renewal was
    written, or the request was slow to reach the record) and another phase drops the lapsed claim: the
    holder claims again (the lease ran out), not "dropped while renewed on time" (which would leave the
    phase running without its workers held)."""
    scaler_server.add_cluster("ray", "stop", replicas=1, max_replicas=4)
    ref = ClusterRef("ray", "stop")
    backend = HeldFirstRenewal(scaler_backend, after_write)
    scaler_backend.claim(ref, "phase-a", 3, lease_seconds=LEASE)
    monitor = PhaseMonitor(backend, ref, Claim("phase-a", 3, lease_seconds=LEASE), WorkerTimeline())
    monitor.start()
    try:
        assert backend.held.wait(30), "the monitor never renewed its claim"
        _drop_lapsed(scaler_backend, ref)
        backend.resume.set()
        _reclaimed_or_given_up(monitor, scaler_backend, ref)
    finally:
        backend.resume.set()
        monitor.stop(timeout=5)
        scaler_backend.release(ref, "phase-a")


def test_a_holder_stopped_between_its_claim_and_its_monitor_counts_the_stop(scaler_server, scaler_backend):
    """The claim was written, then the holder stopped past its lease before its monitor started: the
    monitor counts from when the claim was sent (``claimed_at``), so it claims again."""
    scaler_server.add_cluster("ray", "early", replicas=1, max_replicas=4)
    ref = ClusterRef("ray", "early")
    claim_sent = read_clocks()
    scaler_backend.claim(ref, "phase-a", 3, lease_seconds=LEASE)
    _drop_lapsed(scaler_backend, ref)
    monitor = PhaseMonitor(
        scaler_backend, ref, Claim("phase-a", 3, lease_seconds=LEASE), WorkerTimeline(), claimed_at=claim_sent
    )
    monitor.start()
    try:
        _reclaimed_or_given_up(monitor, scaler_backend, ref)
    finally:
        monitor.stop(timeout=5)
        scaler_backend.release(ref, "phase-a")
