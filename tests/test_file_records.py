"""FileBookkeeping.settle / claim(observe=...) and the bounded record lock behind them."""
import threading

import pytest

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.errors import ConflictError
from flytekitplugins_ddlscale.filerecords import FileBookkeeping
from flytekitplugins_ddlscale.filestore import FileRecordStore
from flytekitplugins_ddlscale.models import ClusterState

REF = ClusterRef("ray", "ray-files")


def state(workers: int) -> ClusterState:
    return ClusterState(cluster=str(REF), status="Running", desired_workers=workers, existing_workers=workers,
                        ready_workers=None, head_ready=None)


def test_claim_with_observe_records_the_baseline_once(tmp_path):
    books = FileBookkeeping(FileRecordStore(tmp_path))
    books.claim(REF, "a", 3, observe=lambda: state(1))
    books.claim(REF, "b", 2, observe=lambda: state(3))
    assert books.get_baseline(REF).replicas == 1
    assert sorted(books.claims(REF)) == ["a", "b"]


def test_settle_forgets_the_baseline_only_when_no_claim_remains_and_act_succeeds(tmp_path):
    books = FileBookkeeping(FileRecordStore(tmp_path))
    books.claim(REF, "a", 3, observe=lambda: state(1))
    seen = books.settle(REF, lambda claim, baseline: (claim.claim_id, baseline.replicas))
    assert seen == ("a", 1) and books.get_baseline(REF) is not None
    books.release(REF, "a")

    def failing(claim, baseline):
        raise RuntimeError("the service refused")

    with pytest.raises(RuntimeError):
        books.settle(REF, failing)
    assert books.get_baseline(REF).replicas == 1
    assert books.settle(REF, lambda claim, baseline: (claim, baseline.replicas)) == (None, 1)
    assert books.get_baseline(REF) is None
    assert books.settle(REF, lambda claim, baseline: (claim, baseline)) == (None, None)


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
            FileBookkeeping(FileRecordStore(tmp_path, lock_timeout=0.2)).claim(REF, "late", 1)
        assert "record lock" in str(caught.value) and ".lock" in str(caught.value)
    finally:
        done.set()
        holder.join(10)
    assert not holder.is_alive()
