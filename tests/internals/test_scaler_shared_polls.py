"""Scaler waits share polls per cluster, are paced per service, and slow down together on 429/503.

Against the scaler test server (real HTTP); it records every request with its arrival time.
"""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from flytekitplugins_ddlscale import ClusterRef, InvalidInputError
from flytekitplugins_ddlscale.backends.scaler import ScalerOptions, ScalerServiceBackend
from flytekitplugins_ddlscale._core.settings import SCALER_MAX_RPS
from flytekitplugins_ddlscale.backends.scaler._polls import PollPacer, SharedPolls, max_rps_from
from flytekitplugins_ddlscale.errors import BackendUnavailableError, ClusterNotFoundError, ScalingError, TransientError
from flytekitplugins_ddlscale.backends._base import SharedReads
from flytekitplugins_ddlscale._core.waiting import Backoff, Deadline
from tests.servers.scaler_server import DEFAULT_API_KEY


def make(server, tmp_path, **options):
    options.setdefault("poll_backoff", Backoff(initial=0.05, factor=1.5, cap=0.2))
    options.setdefault("timeout", 5.0)
    return ScalerServiceBackend(
        server.url, api_key=DEFAULT_API_KEY, state_dir=tmp_path / "state", env={},
        options=ScalerOptions(retry_backoff=Backoff(initial=0.01, factor=2.0, cap=0.05), **options),
    )


def cluster_gets(server, name=""):
    return [r for r in server.requests if r.method == "GET" and "/cluster/" in r.path and r.path.endswith(name)]


def test_concurrent_waits_on_one_cluster_share_its_polls(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "shared", replicas=1, max_replicas=6)
    scaler_server.set_pod_ready_delay(1.5)
    waiters = 12
    with make(scaler_server, tmp_path) as backend:
        ref = ClusterRef("ray", "shared")
        backend.scale(ref, 4, wait=False)
        scaler_server.clear_requests()
        began = time.monotonic()
        with ThreadPoolExecutor(waiters) as pool:
            states = list(pool.map(lambda _: backend.wait_for_workers(ref, 4, timeout=30), range(waiters)))
        took = time.monotonic() - began
    assert [s.existing_workers for s in states] == [4] * waiters
    gets = len(cluster_gets(scaler_server, "/shared"))
    # Each wait reads the cluster once when it starts; its polls are shared: a read at most 0.5 s old
    # answers every wait, so at most one poll per 0.5 s (plus one in flight) whatever the number of waits.
    assert gets <= waiters + 2 * (took / 0.5 + 1), (gets, took)
    # Without sharing, 12 waits polling every 0.2 s would send several times that.
    assert gets < waiters * took / 0.2


def test_polls_across_clusters_are_paced_to_the_configured_rate(scaler_server, tmp_path):
    names = ["p0", "p1"]  # fewer than LIST_FROM: each wait polls its own cluster, 20 times a second unpaced
    for name in names:
        scaler_server.add_cluster("dask", name, replicas=1, max_replicas=4)
    scaler_server.set_pod_ready_delay(2.0)
    rate = 5.0
    with make(scaler_server, tmp_path, max_requests_per_second=rate) as backend:
        for name in names:
            backend.scale(ClusterRef("dask", name), 2, wait=False)
        scaler_server.clear_requests()
        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(lambda n: backend.wait_for_workers(ClusterRef("dask", n), 2, timeout=30), names))
    # Every read of a wait is a poll and takes a slot 1/rate apart.
    polls = sorted(r.at for r in cluster_gets(scaler_server))
    assert len(polls) >= 4
    # Slots are 0.2 s apart, so N polls span at least (N-1) x 0.2 s (10 % for clock reads).
    span = polls[-1] - polls[0]
    assert span >= (len(polls) - 1) / rate * 0.9, (span, len(polls))


def test_a_429_slows_every_waiter_down(scaler_server, tmp_path):
    names = ["s1", "s2", "s3"]
    for name in names:
        scaler_server.add_cluster("spark", name, replicas=1, max_replicas=4)
    scaler_server.set_pod_ready_delay(1.5)
    with make(scaler_server, tmp_path) as backend:
        for name in names:
            backend.scale(ClusterRef("spark", name), 2, wait=False)
        pacer = backend._client.pacer
        slowdowns = pacer.slowdowns
        scaler_server.clear_requests()
        scaler_server.inject_faults("status", count=1, status=429, path="/cluster/", method="GET")
        with ThreadPoolExecutor(len(names)) as pool:
            states = list(pool.map(lambda n: backend.wait_for_workers(ClusterRef("spark", n), 2, timeout=30), names))
    assert [s.existing_workers for s in states] == [2, 2, 2]
    assert pacer.slowdowns == slowdowns + 1
    requests = sorted(cluster_gets(scaler_server), key=lambda r: r.at)
    refused = next(r for r in requests if r.status == 429)
    later = [r for r in requests if r.at > refused.at]
    # No waiter (not only the one refused) polled again during the shared pause of 0.5 s; a request
    # already on its way when the 429 was answered may still arrive just after it.
    assert not [r for r in later if refused.at + 0.1 < r.at < refused.at + 0.45]
    assert any(r.path.endswith(n) for r in later for n in names if not refused.path.endswith(n))


def test_connector_style_status_reads_share_one_request_per_cluster(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "status", replicas=2, max_replicas=4)
    with make(scaler_server, tmp_path) as backend:
        scaler_server.clear_requests()

        def status(_):
            return backend.get_state(ClusterRef("ray", "status"), SharedReads(max_age=5.0))

        with ThreadPoolExecutor(20) as pool:
            states = list(pool.map(status, range(40)))
        assert {s.existing_workers for s in states} == {2}
        assert len(cluster_gets(scaler_server, "/status")) == 1
        # Without shared reads every read is the caller's own.
        backend.get_state(ClusterRef("ray", "status"))
    assert len(cluster_gets(scaler_server, "/status")) == 2


def test_a_cached_read_sends_nothing_and_answers_only_from_a_shared_read_it_may_reuse(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "held", replicas=2, max_replicas=4)
    with make(scaler_server, tmp_path) as backend:
        ref, reads = ClusterRef("ray", "held"), SharedReads(max_age=60.0)
        scaler_server.clear_requests()
        assert backend.cached_state(ref, reads) is None  # nothing shared yet: the caller reads
        assert scaler_server.requests == []
        assert backend.get_state(ref, reads).existing_workers == 2
        scaler_server.clear_requests()
        assert backend.cached_state(ref, reads).existing_workers == 2
        assert backend.cached_state(ref, SharedReads(max_age=60.0, not_before=time.time())) is None
        assert scaler_server.requests == []


def test_a_scale_is_never_answered_by_a_read_from_before_it(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "fresh", replicas=1, max_replicas=4)
    with make(scaler_server, tmp_path) as backend:
        ref = ClusterRef("ray", "fresh")
        reads = SharedReads(max_age=60.0)
        assert backend.get_state(ref, reads).desired_workers == 1
        backend.scale(ref, 3, wait=False)
        assert backend.get_state(ref, reads).desired_workers == 3


def test_rate_setting_is_checked_and_named():
    assert max_rps_from(None, {}) == 100.0
    assert max_rps_from(None, {SCALER_MAX_RPS.name: "7.5"}) == 7.5
    assert max_rps_from(3, {SCALER_MAX_RPS.name: "7.5"}) == 3.0
    for bad in (0, -1, "fast", True, float("inf")):
        with pytest.raises(InvalidInputError, match="max_requests_per_second"):
            max_rps_from(bad, {})
    with pytest.raises(InvalidInputError, match=SCALER_MAX_RPS.name):
        max_rps_from(None, {SCALER_MAX_RPS.name: "0"})
    with pytest.raises(InvalidInputError, match="max_requests_per_second"):
        ScalerServiceBackend("http://127.0.0.1:9", api_key="k-1", env={}, options=ScalerOptions(max_requests_per_second=0))


def test_pacer_spaces_slots_pauses_everyone_and_recovers():
    now = [100.0]
    pacer = PollPacer(4.0, clock=lambda: now[0])
    assert [pacer.slot(None) for _ in range(3)] == [0.0, 0.25, 0.5]
    pacer.slowed(retry_after=2.0)
    assert pacer.rate == 2.0 and pacer.slot(None) == 2.0
    pacer.slowed(retry_after=None)
    assert pacer.rate == 1.0
    for _ in range(10):
        pacer.answered()
    assert pacer.rate == 4.0
    assert pacer.slot(Deadline(0.1)) <= 0.1  # never sleeps past the caller's deadline


def test_shared_poll_errors_outages_are_retried_by_the_joiner_others_shared():
    polls = SharedPolls()
    gate = threading.Event()
    calls = []

    def failing_slowly():
        calls.append(1)
        gate.wait(5)
        raise BackendUnavailableError("down")

    results = {}

    def leader():
        try:
            polls.read("k", failing_slowly, 0.0, Deadline(5))
        except BackendUnavailableError as exc:
            results["leader"] = exc

    first = threading.Thread(target=leader)
    first.start()
    while not calls:
        time.sleep(0.01)
    joiner = threading.Thread(target=lambda: results.update(joiner=polls.read("k", lambda: "fresh", 0.0, Deadline(5))))
    joiner.start()
    time.sleep(0.05)
    gate.set()
    first.join(5)
    joiner.join(5)
    assert isinstance(results["leader"], BackendUnavailableError) and results["joiner"] == "fresh"

    def missing():
        raise ClusterNotFoundError("gone")

    with pytest.raises(ClusterNotFoundError):
        polls.read("m", missing, 0.0, None)


def test_waits_on_many_clusters_of_a_kind_are_answered_by_one_list(scaler_server, tmp_path):
    names = [f"l{i}" for i in range(8)]
    for name in names:
        scaler_server.add_cluster("dask", name, replicas=1, max_replicas=4)
    scaler_server.set_pod_ready_delay(1.5)
    with make(scaler_server, tmp_path) as backend:
        for name in names:
            backend.scale(ClusterRef("dask", name), 2, wait=False)
        scaler_server.clear_requests()
        began = time.monotonic()
        with ThreadPoolExecutor(len(names)) as pool:
            states = list(pool.map(lambda n: backend.wait_for_workers(ClusterRef("dask", n), 2, timeout=30), names))
        took = time.monotonic() - began
    assert [s.existing_workers for s in states] == [2] * len(names)
    lists = [r for r in scaler_server.requests if "/list/" in r.path]
    singles = cluster_gets(scaler_server)
    assert lists, "no list was used"
    # Until LIST_FROM waits have noted their cluster, a wait reads its own; after that, lists only
    # (at most one per SHARED_POLL_AGE), whatever the number of clusters.
    assert len(singles) <= len(names)
    assert len(lists) <= took / 0.3 + 2


def test_a_cluster_missing_from_the_list_gets_its_own_error(scaler_server, tmp_path):
    names = ["m1", "m2", "m3"]
    for name in names:
        scaler_server.add_cluster("ray", name, replicas=1, max_replicas=4)
    with make(scaler_server, tmp_path) as backend:
        client = backend._client
        for name in names:
            client.shared_by_list(ClusterRef("ray", name))
        scaler_server.remove_cluster("ray", "m3")
        with pytest.raises(ScalingError) as caught:
            client.poll_cluster(ClusterRef("ray", "m3"), Deadline(5), 0.0)
    assert "m3" in str(caught.value)
    assert any("/list/" in r.path for r in scaler_server.requests)
    assert any(r.path.endswith("/cluster/rayclusters/m3") for r in scaler_server.requests)


def test_shared_status_reads_give_up_at_their_budget_while_the_service_hangs(scaler_server, tmp_path):
    """A connector's reads (shared reads with the call budget) of a hung service end at the budget, the
    read leading the shared poll and those joining it alike, though each request may take a minute."""
    scaler_server.add_cluster("ray", "hung", replicas=1, max_replicas=4)
    with make(scaler_server, tmp_path, timeout=60.0) as backend:
        scaler_server.hang()
        outcomes = []

        def status():
            try:
                outcomes.append(backend.get_state(ClusterRef("ray", "hung"), SharedReads(max_age=1.0, budget=0.3)))
            except ScalingError as error:
                outcomes.append(error)

        threads = [threading.Thread(target=status) for _ in range(5)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)  # a guard against hanging the suite; the budget ends them long before
            assert not any(thread.is_alive() for thread in threads)
        finally:
            scaler_server.resume()
        assert len(outcomes) == 5 and all(isinstance(o, TransientError) for o in outcomes), outcomes


def test_a_shared_read_begun_before_another_process_s_change_is_not_reused(scaler_server, tmp_path):
    """A connector replica's create scales the cluster; this process's shared read from before is still
    within its age, and nothing here hears of the change: a poll reading from the create's time on
    (``not_before``) reads the service again."""
    import httpx

    scaler_server.add_cluster("ray", "other", replicas=1, max_replicas=4)
    ref = ClusterRef("ray", "other")
    with make(scaler_server, tmp_path) as backend:
        assert backend.get_state(ref, SharedReads(max_age=60.0)).desired_workers == 1
        # Another process's write: this process's shared polls are not told.
        answer = httpx.patch(f"{scaler_server.url}/ddl_cluster_scaler/scale/rayclusters/other", json={"replicas": 3},
                             headers={"X-Domino-Api-Key": DEFAULT_API_KEY})
        assert answer.status_code == 200, answer.text
        changed = time.time()
        scaler_server.clear_requests()
        assert backend.get_state(ref, SharedReads(max_age=60.0)).desired_workers == 1  # the read from before
        assert cluster_gets(scaler_server) == []
        after = SharedReads(max_age=60.0, not_before=changed)
        assert backend.get_state(ref, after).desired_workers == 3
        assert backend.get_state(ref, after).desired_workers == 3  # that new read is shared from then on
        assert len(cluster_gets(scaler_server)) == 1


class WaitingDeadline(Deadline):
    """A deadline that says when its reader asks how long it may wait (it is about to wait on a fetch)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.asked = threading.Event()

    @property
    def remaining(self) -> float:
        self.asked.set()
        return super().remaining


def test_a_reader_does_not_join_a_fetch_begun_before_its_not_before():
    polls = SharedPolls()
    gate, calls = threading.Event(), []

    def old_read():
        calls.append("old")
        gate.wait(5)
        return "before"

    first = threading.Thread(target=lambda: polls.read("k", old_read, 60.0, Deadline(5)))
    first.start()
    while not calls:
        time.sleep(0.01)
    changed = time.time()
    results, joining = {}, WaitingDeadline(5)
    joiner = threading.Thread(target=lambda: results.update(
        late=polls.read("k", lambda: calls.append("new") or "after", 60.0, joining, not_before=changed)
    ))
    joiner.start()
    assert joining.asked.wait(5), "the reader never waited on the fetch in flight"
    gate.set()
    first.join(5)
    joiner.join(5)
    assert results["late"] == "after" and calls == ["old", "new"]
    assert polls.read("k", lambda: "unused", 60.0, None) == "after"
