"""Load: 500 scale/get calls (plus claims and releases) from 20 threads sharing one backend,
with 5 % of the service's answers failing.

Checked: no deadlock (every thread ends within a bound), every failure is a
typed ScalingError, no lost update (the claims on record are exactly the
claims made and not released; baselines are the sizes before any change),
and bounded memory (tracemalloc peak and RSS growth under generous bounds).
"""
import random
import threading
import tracemalloc
from typing import Any, Callable, Dict, Iterator, List, Set, Tuple

import pytest
from rel_helpers import Background, desired

from flytekitplugins_ddlscale import ClusterRef, ScalingError

THREADS = 20
CALLS_PER_THREAD = 25
FAILURE_EVERY = 20
"""One injected failure per 20 requests the server receives: 5 %."""
JOIN_TIMEOUT = 120.0
PEAK_BOUND = 64 * 2**20
RSS_GROWTH_BOUND = 150 * 2**20
CLUSTERS = [ClusterRef("ray", f"ray-load-{i}") for i in range(10)]
INITIAL = {ref.name: 1 + i % 3 for i, ref in enumerate(CLUSTERS)}


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class FaultFeeder(Background):
    """Keeps one injected failure pending for every ``FAILURE_EVERY`` requests a server has received."""

    def __init__(self, requests_seen: Callable[[], int], inject: Callable[[int], None]) -> None:
        super().__init__("fault-feeder")
        self._requests_seen = requests_seen
        self._inject = inject
        self.injected = 0

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            due = self._requests_seen() // FAILURE_EVERY
            while self.injected < due:
                self._inject(self.injected)
                self.injected += 1


class Worker:
    """One thread's share of the calls and what it expects to remain on record."""

    def __init__(self, index: int, backend, seed: int) -> None:
        self.index = index
        self.backend = backend
        self.rng = random.Random(seed)
        self.live: Dict[str, Set[str]] = {ref.name: set() for ref in CLUSTERS}
        self.calls = 0
        self.typed_failures: List[ScalingError] = []
        self.untyped: List[BaseException] = []

    def run(self) -> None:
        for step in range(CALLS_PER_THREAD):
            ref = CLUSTERS[(self.index + step) % len(CLUSTERS)]
            try:
                self._call(step, ref)
            except ScalingError as exc:
                self.typed_failures.append(exc)
            except BaseException as exc:  # anything untyped is a finding
                self.untyped.append(exc)
            self.calls += 1

    def _call(self, step: int, ref: ClusterRef) -> None:
        # Every step is one scale or get (500 in all); claims and releases come on top.
        if step % 5 == 0:
            claim_id = f"t{self.index}-s{step}"
            self.backend.claim(ref, claim_id, self.rng.randint(1, 8))
            self.live[ref.name].add(claim_id)
        elif step % 5 == 1 and self.live[ref.name]:
            claim_id = sorted(self.live[ref.name])[0]
            self.backend.release(ref, claim_id)
            self.live[ref.name].discard(claim_id)
        if step % 2 == 0:
            result = self.backend.scale(ref, self.rng.randint(0, 10), wait=False)
            assert result.effective == min(result.requested, 8)
        else:
            self.backend.get_state(ref)


def warm_up(backend: Any, fail_once: Callable[[], None]) -> None:
    """One call of each kind, one of them failing, before memory is measured.

    Libraries import code on first use (the kubernetes client loads ~250 model
    modules lazily); that one-time cost is not what the bound is about.
    """
    ref = CLUSTERS[0]
    fail_once()
    backend.claim(ref, "warm-up", 1)
    backend.release(ref, "warm-up")
    backend.scale(ref, INITIAL[ref.name], wait=False)
    backend.get_state(ref)


def run_load(backend: Any, feeder: FaultFeeder) -> Tuple[List[Worker], int, int]:
    """Run every worker thread under ``feeder``; return the workers, tracemalloc peak and RSS growth."""
    workers = [Worker(i, backend, seed=1000 + i) for i in range(THREADS)]
    threads = [threading.Thread(target=w.run, name=f"load-{w.index}") for w in workers]
    rss_before = rss_bytes()
    tracemalloc.start()
    try:
        with feeder:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(JOIN_TIMEOUT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"deadlock or hang: {stuck} still running after {JOIN_TIMEOUT:.0f}s"
    assert sum(w.calls for w in workers) == THREADS * CALLS_PER_THREAD
    assert [e for w in workers for e in w.untyped] == []
    return workers, peak, rss_bytes() - rss_before


def expected_claims(workers: List[Worker], ref: ClusterRef) -> Set[str]:
    return set().union(*(w.live[ref.name] for w in workers))


def check_memory(peak: int, rss_growth: int, failures: int, workers: List[Worker]) -> None:
    assert peak < PEAK_BOUND, f"tracemalloc peak {peak / 2**20:.1f} MiB"
    assert rss_growth < RSS_GROWTH_BOUND, f"RSS grew {rss_growth / 2**20:.1f} MiB"
    typed = sum(len(w.typed_failures) for w in workers)
    print(f"injected failures answered={failures} typed call failures={typed} "
          f"tracemalloc peak={peak / 2**20:.1f} MiB RSS growth={rss_growth / 2**20:.1f} MiB")


@pytest.mark.slow
def test_scaler_twenty_threads_500_calls_with_5_percent_503s(scaler_server, make_scaler):
    for ref in CLUSTERS:
        scaler_server.add_cluster("ray", ref.name, replicas=INITIAL[ref.name], max_replicas=8)
    backend = make_scaler(retries=3, timeout=5.0)
    inject = lambda _: scaler_server.inject_faults("status", 1, status=503)  # noqa: E731
    warm_up(backend, lambda: inject(0))
    feeder = FaultFeeder(lambda: len(scaler_server.requests), inject)
    workers, peak, rss_growth = run_load(backend, feeder)
    scaler_server.clear_faults()

    failed_answers = sum(1 for r in scaler_server.requests if r.status == 503)
    assert feeder.injected >= 20 and failed_answers >= 20, (feeder.injected, failed_answers)
    for ref in CLUSTERS:
        assert set(backend.records.claims(ref)) == expected_claims(workers, ref), f"lost claim update on {ref}"
        baseline = backend.get_baseline(ref)
        assert baseline is not None and baseline.replicas == INITIAL[ref.name], baseline
        assert 0 <= desired(scaler_server, "ray", ref.name) <= 8
    check_memory(peak, rss_growth, failed_answers, workers)


@pytest.fixture
def k8s_server() -> Iterator[Any]:
    """The Kubernetes test server with a short watch history: it shares this process's memory."""
    from tests.servers.k8s_server import K8sTestServer

    with K8sTestServer(ready_delay=0.02, history_limit=200) as server:
        yield server


@pytest.mark.slow
def test_k8s_twenty_threads_500_calls_with_5_percent_409s(k8s_server, make_k8s):
    from flytekitplugins_ddlscale._core.records import CLAIMS_ANNOTATION, decode_claims

    for ref in CLUSTERS:
        k8s_server.add_cluster("ray", ref.name, replicas=INITIAL[ref.name], autoscaling={"minReplicas": 1, "maxReplicas": 8})
    backend = make_k8s(conflict_retries=8)
    # A concurrent writer touches a cluster before its next PATCH: that PATCH answers 409.
    inject = lambda n: k8s_server.interfere("ray", CLUSTERS[n % len(CLUSTERS)].name, times=1)  # noqa: E731
    warm_up(backend, lambda: inject(0))
    feeder = FaultFeeder(lambda: len(k8s_server.requests), inject)
    workers, peak, rss_growth = run_load(backend, feeder)

    conflicts = sum(1 for r in k8s_server.requests if r.status == 409)
    assert feeder.injected >= 20 and conflicts >= 10, (feeder.injected, conflicts)
    for ref in CLUSTERS:
        notes = k8s_server.get_object("ray", ref.name)["metadata"].get("annotations") or {}
        assert set(decode_claims(notes.get(CLAIMS_ANNOTATION))) == expected_claims(workers, ref), ref
        baseline = backend.get_baseline(ref)
        assert baseline is not None and baseline.replicas == INITIAL[ref.name], baseline
        # Replicas and the HPA floor change in one patch, so they always agree (zero: no autoscaling),
        # and maxReplicas survives every removal and re-addition of the autoscaling section.
        spec = k8s_server.get_object("ray", ref.name)["spec"]
        replicas = spec["worker"]["replicas"]
        if replicas == 0:
            assert "autoscaling" not in spec, spec
        else:
            assert spec["autoscaling"] == {"minReplicas": replicas, "maxReplicas": 8}, spec
    check_memory(peak, rss_growth, conflicts, workers)
