"""FileRecordStore and the FileBookkeeping built on it, including concurrent writers."""
import multiprocessing

import pytest

from flytekitplugins_ddlscale import ClusterRef, ClusterState, InvalidInputError
from flytekitplugins_ddlscale.backends._support.filerecords import FileBookkeeping
from flytekitplugins_ddlscale.backends._support.filestore import FileRecordStore
from flytekitplugins_ddlscale._core.records import Claim

REF = ClusterRef("dask", "dask-a")


def _add_claims(directory, start, count, added, done):
    books = FileBookkeeping(FileRecordStore(directory))
    for i in range(start, start + count):
        books.claim(REF, Claim(f"claim-{i}", i % 7))
    added.put(start)
    done.wait(60)  # a claim counts while its holder lives


def test_update_read_and_delete_when_empty(tmp_path):
    store = FileRecordStore(tmp_path)
    assert store.read(REF) == {}
    assert store.update(REF, lambda r: r.setdefault("k", 1)) == 1
    assert store.get(REF, "k") == 1 and store.get(ClusterRef("dask", "dask-a", "ns2"), "k") is None
    store.update(REF, lambda r: r.clear())
    assert not list(tmp_path.glob("*.json"))


def test_default_directory_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "s"))
    assert FileRecordStore().directory == tmp_path / "s" / "records"


def test_concurrent_processes_never_lose_a_claim(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    added, done = ctx.Queue(), ctx.Event()
    workers = [ctx.Process(target=_add_claims, args=(str(tmp_path), n * 20, 20, added, done)) for n in range(3)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            added.get(timeout=60)
        assert len(FileBookkeeping(FileRecordStore(tmp_path)).claims(REF)) == 60
    finally:
        done.set()
        for worker in workers:
            worker.join(timeout=60)
    assert all(worker.exitcode == 0 for worker in workers)
    # Their holders are gone now: none of the 60 counts any more.
    assert FileBookkeeping(FileRecordStore(tmp_path)).claims(REF) == {}


def test_bookkeeping_baseline_is_recorded_once(tmp_path):
    books = FileBookkeeping(FileRecordStore(tmp_path))
    observed = []

    def observe():
        observed.append(1)
        return ClusterState("dask/dask-a", "Running", 2, 2, autoscaling_max=4)

    assert books.record_baseline(REF, observe).replicas == 2
    assert books.record_baseline(REF, observe).replicas == 2
    assert len(observed) == 1
    assert books.restore(REF)[0].replicas == 2
    assert books.get_baseline(REF) is None and books.restore(REF) == (None, [])


def test_bookkeeping_claims(tmp_path):
    books = FileBookkeeping(FileRecordStore(tmp_path))
    assert books.claim(REF, Claim("a", 2)).replicas == 2
    assert books.claim(REF, Claim("b", 5, "GPU")).worker_hw_tier == "GPU"
    assert books.claim(REF, Claim("b", 1)).claim_id == "a"
    assert books.release(REF, "a").claim_id == "b"
    assert books.release(REF, "b") is None
    assert books.claims(REF) == {}
    bad_calls = (
        lambda: books.claim(REF, Claim("", 1)), lambda: books.claim(REF, Claim("x", -1)), lambda: books.release(REF, None)
    )
    for bad in bad_calls:
        with pytest.raises(InvalidInputError):
            bad()
