"""``reconcile``: scale to the largest live claim, or restore the baseline once none remains,
decided atomically against concurrent claims and releases (scaler, Kubernetes and local)."""
import contextlib
import threading
from typing import Any, Callable, Iterator, List

import pytest
from tests.flyte_support import local_backend, local_env  # noqa: F401 - fixture
from tests.servers.k8s_fixtures import backend, k8s, make_backend, tiers_file  # noqa: F401 - fixtures
from tests.servers.scaler_server import DEFAULT_API_KEY

from flytekitplugins_ddlscale import ClusterRef, ReplicaSpec, ScalingTimeoutError
from flytekitplugins_ddlscale.backends.scaler import ScalerOptions, ScalerServiceBackend
from flytekitplugins_ddlscale._core.records import BASELINE_ANNOTATION, CLAIMS_ANNOTATION
from flytekitplugins_ddlscale._core.waiting import Backoff

RAY = ClusterRef("ray", "ray-rec")
ROUNDS = 12


@contextlib.contextmanager
def scaler_pair(server: Any, state: Any) -> Iterator[List[ScalerServiceBackend]]:
    """Two scaler backends sharing one state directory: two processes of one machine."""
    made = [
        ScalerServiceBackend(
            server.url, api_key=DEFAULT_API_KEY, state_dir=state, env={},
            options=ScalerOptions(timeout=5.0, retry_backoff=Backoff(initial=0.01, factor=2.0, cap=0.05),
                                  poll_backoff=Backoff(initial=0.02, factor=1.5, cap=0.1)),
        )
        for _ in range(2)
    ]
    try:
        yield made
    finally:
        for instance in made:
            instance.close()


def race(first: Callable[[], Any], second: Callable[[], Any]) -> None:
    """Run both at the same moment in two threads; re-raise the first error either hit."""
    gate = threading.Barrier(2, timeout=10)
    errors: List[BaseException] = []

    def run(step: Callable[[], Any]) -> None:
        try:
            gate.wait()
            step()
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(step,)) for step in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]


def ending_and_starting(ending: Any, starting: Any, desired: Callable[[], int]) -> None:
    """Phase A ends (release + reconcile) while phase B starts (claim + reconcile), ROUNDS times.

    Whatever the interleaving, B ends up holding the cluster at its size; when B
    ends, the baseline (1 worker) comes back and is forgotten.
    """
    for round_ in range(ROUNDS):
        ending.claim(RAY, "phase-a", 3)
        ending.reconcile(RAY, wait=False)
        assert desired() == 3

        def end_a() -> None:
            ending.release(RAY, "phase-a")
            ending.reconcile(RAY, wait=False)

        def start_b() -> None:
            starting.claim(RAY, "phase-b", 2)
            starting.reconcile(RAY, wait=False)

        race(end_a, start_b)
        assert desired() == 2, f"round {round_}: phase B was shrunk"
        assert starting.release(RAY, "phase-b") is None
        assert starting.reconcile(RAY, wait=False).effective == 1
        assert desired() == 1 and starting.get_baseline(RAY) is None


def test_scaler_reconcile_follows_the_largest_claim_then_restores(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-rec", replicas=1, max_replicas=6, worker_tier_id="small-k8s")
    assert scaler_backend.reconcile(RAY) is None  # no claim, no baseline: nothing to do
    assert scaler_server.count("PATCH") == 0
    scaler_backend.claim(RAY, "big", 4, "Medium")
    scaler_backend.claim(RAY, "small", 2, "Medium")
    result = scaler_backend.reconcile(RAY, timeout=10)
    assert (result.effective, result.final.existing_workers, result.final.worker_hw_tier) == (4, 4, "medium-k8s")
    scaler_backend.release(RAY, "big")
    assert scaler_backend.reconcile(RAY, timeout=10).final.existing_workers == 2
    assert scaler_backend.get_baseline(RAY) is not None  # a claim is still live
    scaler_backend.release(RAY, "small")
    assert scaler_backend.reconcile(RAY, ReplicaSpec(3), timeout=10).final.existing_workers == 3
    assert scaler_backend.get_baseline(RAY) is None
    assert scaler_backend.reconcile(RAY) is None


def test_scaler_claim_records_the_baseline_with_the_claim(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-rec", replicas=2, max_replicas=6)
    scaler_backend.claim(RAY, "p", 5)
    assert scaler_backend.get_baseline(RAY).replicas == 2
    assert scaler_server.count("PATCH") == 0  # a claim alone changes no cluster


def test_scaler_failed_restore_keeps_the_baseline(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-rec", replicas=1, max_replicas=6)
    scaler_backend.claim(RAY, "p", 3)
    scaler_backend.reconcile(RAY, wait=False)
    scaler_backend.release(RAY, "p")
    scaler_server.stop()
    with pytest.raises(ScalingTimeoutError):  # the reconcile rides out the outage until its timeout
        scaler_backend.reconcile(RAY, wait=False, timeout=1.0)
    assert scaler_backend.get_baseline(RAY).replicas == 1


def test_scaler_phase_ending_never_shrinks_a_phase_starting(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-rec", replicas=1, max_replicas=6)
    with scaler_pair(scaler_server, tmp_path / "shared") as (a, b):
        ending_and_starting(a, b, lambda: int(scaler_server.cluster_object("ray", "ray-rec")["spec"]["worker"]["replicas"]))
        assert b.records.claims(RAY) == {}


def test_k8s_reconcile_holds_the_claim_tier_then_restores_exactly(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "ray-rec", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 6},
                    worker_tier="small-k8s")
    original = k8s.get_object("ray", "ray-rec")["spec"]
    assert backend.reconcile(RAY) is None
    backend.claim(RAY, "p", 3, "medium")
    result = backend.reconcile(RAY, timeout=20)
    assert (result.final.ready_workers, result.final.worker_hw_tier) == (3, "medium-k8s")
    backend.release(RAY, "p")
    result = backend.reconcile(RAY, timeout=20)
    assert (result.final.ready_workers, result.final.worker_hw_tier) == (1, "small-k8s")
    obj = k8s.get_object("ray", "ray-rec")
    annotations = obj["metadata"].get("annotations") or {}
    assert BASELINE_ANNOTATION not in annotations and CLAIMS_ANNOTATION not in annotations
    for section in ("worker", "autoscaling"):
        assert obj["spec"][section] == original[section], section


def test_k8s_phase_ending_never_shrinks_a_phase_starting(k8s, tiers_file):  # noqa: F811
    k8s.add_cluster("ray", "ray-rec", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 6})
    with make_backend(k8s, tiers_file) as a, make_backend(k8s, tiers_file) as b:
        ending_and_starting(a, b, lambda: int(k8s.get_object("ray", "ray-rec")["spec"]["worker"]["replicas"]))


@pytest.mark.slow
def test_local_reconcile_follows_claims_and_takes_down_what_it_created(local_env):  # noqa: F811
    backend = local_backend(local_env)
    ref = ClusterRef("dask", "rec-local")
    try:
        assert backend.reconcile(ref) is None
        backend.claim(ref, "big", 2)
        backend.claim(ref, "small", 1)
        assert backend.reconcile(ref, timeout=60).final.ready_workers == 2
        backend.release(ref, "big")
        assert backend.reconcile(ref, timeout=60).final.ready_workers == 1
        backend.release(ref, "small")
        backend.reconcile(ref, timeout=60)
        assert backend.list_clusters() == [] and backend.get_baseline(ref) is None
    finally:
        backend.down(ref)


def _claim_while(reconcile: Callable[[], Any], claim: Callable[[], Any], started: Callable[[], bool]) -> List[Any]:
    """Run ``reconcile`` in a thread; once ``started()``, ``claim()`` here; return [reconcile's outcome]."""
    outcome: List[Any] = []

    def run() -> None:
        try:
            outcome.append(reconcile())
        except BaseException as exc:  # reported to the caller
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        for _ in range(600):
            if started():
                break
            threading.Event().wait(0.02)
        claim()
    finally:
        thread.join(60)
    assert not thread.is_alive()
    return outcome


def test_scaler_reconcile_rides_out_an_outage_without_the_record_lock(scaler_server, tmp_path):
    """The service is down: phase A's reconcile rides it out, but not under the record lock, so
    phase B's claim (no service call needed: the sizes are recorded) is done within its own 2 s."""
    scaler_server.add_cluster("ray", "ray-rec", replicas=1, max_replicas=6)
    with scaler_pair(scaler_server, tmp_path / "shared") as (a, b):
        a.claim(RAY, "a", 3)
        scaler_server.stop()
        outcome = _claim_while(
            lambda: a.reconcile(RAY, wait=False, timeout=4.0),
            lambda: b.claim(RAY, "b", 2, timeout=2.0),
            lambda: a._client.outage.down,
        )
        assert isinstance(outcome[0], ScalingTimeoutError), outcome
        assert set(b.claims(RAY)) == {"a", "b"}


def test_scaler_reconcile_whose_request_fails_gives_the_lock_back_and_decides_again(scaler_server, tmp_path):
    """The service answers every scale request 503 for a while, longer than a locked step (0.3 s; the
    client's 10 retries, 0.1 s doubling, outlast it): the lock is given back between tries (B claims
    meanwhile), and once the service answers, A's new decision includes B's claim."""
    scaler_server.add_cluster("ray", "ray-rec", replicas=1, max_replicas=6)
    state = tmp_path / "shared"
    a = ScalerServiceBackend(
        scaler_server.url, api_key=DEFAULT_API_KEY, state_dir=state, env={},
        options=ScalerOptions(timeout=5.0, retries=10, retry_backoff=Backoff(initial=0.1, factor=2.0, cap=0.5),
                              poll_backoff=Backoff(initial=0.02, factor=1.5, cap=0.1)),
    )
    with a, scaler_pair(scaler_server, state) as (b, _):
        a.locked_step_seconds = 0.3
        a.claim(RAY, "a", 3)
        scaler_server.inject_faults("status", 10_000, status=503, method="PATCH")

        def claim_then_heal() -> None:
            b.claim(RAY, "b", 5, timeout=2.0)
            scaler_server.clear_faults()

        outcome = _claim_while(
            lambda: a.reconcile(RAY, wait=False, timeout=30.0),
            claim_then_heal,
            lambda: scaler_server.count("PATCH") > 0,
        )
        assert not isinstance(outcome[0], BaseException), outcome
        assert outcome[0].effective == 5  # decided again after the outage: B's larger claim counts
        assert int(scaler_server.cluster_object("ray", "ray-rec")["spec"]["worker"]["replicas"]) == 5
