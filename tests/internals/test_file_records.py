"""FileBookkeeping.settle / claim(observe=...) and the bounded record lock behind them."""
import threading

import pytest

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.errors import ConflictError
from flytekitplugins_ddlscale.backends._support.filerecords import FileBookkeeping
from flytekitplugins_ddlscale.backends._support.filestore import FileRecordStore
from flytekitplugins_ddlscale._core.records import Claim
from flytekitplugins_ddlscale.models import ClusterState

REF = ClusterRef("ray", "ray-files")


def state(workers: int) -> ClusterState:
    return ClusterState(cluster=str(REF), status="Running", desired_workers=workers, existing_workers=workers,
                        ready_workers=None, head_ready=None)


def test_claim_with_observe_records_the_baseline_once(tmp_path):
    books = FileBookkeeping(FileRecordStore(tmp_path))
    books.claim(REF, Claim("a", 3), observe=lambda: state(1))
    books.claim(REF, Claim("b", 2), observe=lambda: state(3))
    assert books.get_baseline(REF).replicas == 1
    assert sorted(books.claims(REF)) == ["a", "b"]


def test_settle_forgets_the_size_outside_phases_only_when_no_claim_remains_and_act_succeeds(tmp_path):
    books = FileBookkeeping(FileRecordStore(tmp_path))
    books.claim(REF, Claim("a", 3), observe=lambda: state(1))
    seen = books.settle(REF, lambda decided: (decided.hold.claim_id, decided.replicas, decided.restore_to.replicas))
    assert seen == ("a", 3, 1) and books.get_baseline(REF) is not None and books.get_outside(REF) is not None
    books.release(REF, "a")

    def failing(decided):
        raise RuntimeError("the service refused")

    with pytest.raises(RuntimeError):
        books.settle(REF, failing)
    assert books.get_baseline(REF).replicas == 1 and books.get_outside(REF).replicas == 1
    assert books.settle(REF, lambda decided: (decided.hold, decided.restore_to.replicas)) == (None, 1)
    # Only phases changed the cluster: the size outside them was the baseline, and both are forgotten.
    assert books.get_baseline(REF) is None and books.get_outside(REF) is None
    assert books.settle(REF, lambda decided: (decided.hold, decided.restore_to)) == (None, None)


def test_a_phase_holds_at_least_the_size_it_found_and_gives_that_back_keeping_the_baseline(tmp_path):
    books = FileBookkeeping(FileRecordStore(tmp_path))
    books.record_baseline(REF, lambda: state(0))  # a node scaled 0 -> 2 before the phase
    books.claim(REF, Claim("a", 1), observe=lambda: state(2))
    assert books.settle(REF, lambda decided: decided.replicas) == 2  # at least 1: 2 is not shrunk
    books.claim(REF, Claim("b", 5), observe=lambda: state(2))
    assert books.settle(REF, lambda decided: decided.replicas) == 5
    books.release(REF, "b")
    books.release(REF, "a")
    assert books.settle(REF, lambda decided: decided.restore_to.replicas) == 2
    assert books.get_outside(REF) is None and books.get_baseline(REF).replicas == 0


def test_the_size_outside_phases_is_a_floor_only_on_the_claims_tier(tmp_path):
    books = FileBookkeeping(FileRecordStore(tmp_path))
    found = ClusterState(cluster=str(REF), status="Running", desired_workers=4, existing_workers=4,
                         ready_workers=None, head_ready=None, worker_hw_tier="small")
    books.claim(REF, Claim("a", 1, "small"), observe=lambda: found)
    assert books.settle(REF, lambda decided: decided.replicas) == 4
    books.claim(REF, Claim("a", 1, "large"), observe=lambda: found)
    assert books.settle(REF, lambda decided: decided.replicas) == 1


def test_settle_records_a_missing_baseline_while_it_holds_a_claim_as_the_kubernetes_patch_does(tmp_path):
    books = FileBookkeeping(FileRecordStore(tmp_path))
    books.claim(REF, Claim("a", 3))  # no observation: nothing recorded with the claim
    assert books.get_baseline(REF) is None
    assert books.settle(REF, lambda decided: decided.replicas, observe=lambda: state(1)) == 3
    assert books.get_baseline(REF).replicas == 1 and books.get_outside(REF) is None


def test_a_restore_forgets_every_claim_and_both_sizes_in_one_update(tmp_path):
    books = FileBookkeeping(FileRecordStore(tmp_path))
    books.claim(REF, Claim("b", 2), observe=lambda: state(1))
    books.claim(REF, Claim("a", 3), observe=lambda: state(5))
    baseline, dropped = books.restore(REF)
    assert (baseline.replicas, dropped) == (1, ["a", "b"])
    assert books.store.read(REF) == {}


def test_waiting_for_a_held_record_lock_is_bounded(tmp_path):
    holding, done = threading.Event(), threading.Event()

    def hold(record):
        holding.set()
        done.wait(10)

    holder = threading.Thread(target=FileRecordStore(tmp_path).update, args=(REF, hold))
    holder.start()
    try:
        assert holding.wait(10)
        with pytest.raises(ConflictError) as caught:
            FileBookkeeping(FileRecordStore(tmp_path, lock_timeout=0.2)).claim(REF, Claim("late", 1))
        assert "record lock" in str(caught.value) and ".lock" in str(caught.value)
    finally:
        done.set()
        holder.join(10)
    assert not holder.is_alive()
