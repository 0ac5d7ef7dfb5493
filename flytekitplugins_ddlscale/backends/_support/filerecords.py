"""Baseline and claim bookkeeping on a :class:`FileRecordStore`, for backends that cannot store records
with the cluster: each operation is one locked read-modify-write that writes the :class:`RecordChange`
:mod:`.claimrules` decides (the JSON of the Kubernetes annotations). A corrupt record raises
:class:`CorruptRecordError` naming its file.
"""
import operator
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from .filestore import FileRecordStore
from ..._core import claimrules
from ..._core.claimrules import ClusterRecords, RecordChange, SameTier, Settlement, Size
from ..._core.leases import log_dropped
from ...models import Baseline, ClusterState
from ..._core.records import Claim, decode_baseline, decode_claims, encode_baseline, encode_claims
from ...refs import ClusterRef
from ..._core.validation import validate_claim_id, validate_replicas, validate_tier_name

T = TypeVar("T")
BASELINE_KEY = "baseline"
CLAIMS_KEY = "claims"
OUTSIDE_KEY = "outside_phases"
RENEW_LOCK_TIMEOUT = 10.0
"""Seconds a renewal waits for the record lock: a renewal that cannot get it is tried again at the next
tick, well within the lease, instead of holding up the phase's cleanup."""
Observe = Callable[[], ClusterState]


class FileBookkeeping:
    """Baselines, claims (leases: dead ones do not count and a claim or settle drops them) and the size
    outside phases of clusters, kept in a :class:`FileRecordStore`."""

    def __init__(self, store: Optional[FileRecordStore] = None) -> None:
        self.store = store if store is not None else FileRecordStore()

    def get_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        """The recorded baseline of ``ref``, or None."""
        return self._size(ref, self.store.read(ref), BASELINE_KEY)

    def get_outside(self, ref: ClusterRef) -> Optional[Baseline]:
        """The size ``ref`` had outside phases, recorded when the first live phase claimed; None when
        no phase is live or unrestored."""
        return self._size(ref, self.store.read(ref), OUTSIDE_KEY)

    def record_baseline(self, ref: ClusterRef, observe: Observe) -> Baseline:
        """The recorded baseline; if there is none, record ``Baseline.from_state(observe())`` (under the
        lock: of two racing processes one observation wins and both get it)."""

        def change(record: Dict[str, str]) -> Baseline:
            read = ClusterRecords(baseline=self._size(ref, record, BASELINE_KEY))
            self._write(record, RecordChange(baseline=claimrules.baseline_before_change(read)), observe)
            return self._size(ref, record, BASELINE_KEY)  # type: ignore[return-value]

        return self.store.update(ref, change)

    def restore(self, ref: ClusterRef) -> Tuple[Optional[Baseline], List[str]]:
        """Forget what a restore ends (:func:`.claimrules.restore`: every claim, the baseline and the size
        outside phases) in one update; return what the baseline was and the ids of the claims dropped."""

        def change(record: Dict[str, str]) -> Tuple[Optional[Baseline], List[str]]:
            read = self._records(ref, record)
            decided, dropped = claimrules.restore(read)
            self._write(record, decided)
            return read.baseline, dropped

        return self.store.update(ref, change)

    def claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """Live claims of ``ref`` by claim id (dead ones are left for the next claim or settle to drop)."""
        return claimrules.live_claims(self._records(ref, self.store.read(ref)).claims)

    def recorded_claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """Every claim on ``ref``'s record by claim id, live or dead."""
        return self._records(ref, self.store.read(ref)).claims

    def claim(
        self, ref: ClusterRef, new: Claim, observe: Optional[Observe] = None, *, timeout: Optional[float] = None
    ) -> Claim:
        """Add or replace ``new``'s claim (a live one it replaces keeps when it was made); the largest live
        claim. In the same locked update (``timeout``: longest wait for the lock), dead claims are dropped
        and, with ``observe``, what :func:`.claimrules.claim` records is taken from ``observe()``."""
        validate_claim_id(new.claim_id)
        validate_replicas(new.replicas)
        new = replace(new, worker_hw_tier=validate_tier_name(new.worker_hw_tier))

        def change(record: Dict[str, str]) -> Claim:
            decided, largest = claimrules.claim(self._records(ref, record), new.renewed())
            log_dropped(str(ref), decided.dead)
            self._write(record, decided, observe)
            return largest

        return self.store.update(ref, change, timeout=timeout)

    def renew(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Renew ``claim_id``'s lease from now (keeping when it was made); return the renewed claim, or
        None when it is gone (released, dropped by ``ddlscale restore``, or dropped as dead)."""
        validate_claim_id(claim_id)

        def change(record: Dict[str, str]) -> Optional[Claim]:
            decided, renewed = claimrules.renew(self._records(ref, record).claims, claim_id)
            self._write(record, decided)
            return renewed

        return self.store.update(ref, change, timeout=RENEW_LOCK_TIMEOUT)

    def release(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Drop ``claim_id`` (no error if absent); return the largest remaining live claim, or None."""
        validate_claim_id(claim_id)

        def change(record: Dict[str, str]) -> Optional[Claim]:
            decided, largest = claimrules.release(self._records(ref, record).claims, claim_id)
            self._write(record, decided)
            return largest

        return self.store.update(ref, change)

    def settle(
        self, ref: ClusterRef, act: Callable[[Settlement], T], same_tier: SameTier = operator.eq,
        timeout: Optional[float] = None, observe: Optional[Observe] = None,
    ) -> T:
        """``act``'s result, called with the record's :class:`Settlement` under its lock (so it only decides
        and sends the change, never waits). Once it returns the settlement's change is written (sizes to
        record from ``observe()``); when it raises, the record is left as it was."""

        def change(record: Dict[str, str]) -> T:
            decided = claimrules.settle(self._records(ref, record), same_tier)
            result = act(decided)
            log_dropped(str(ref), decided.dead)
            self._write(record, decided.change, observe)
            return result

        return self.store.update(ref, change, timeout=timeout)

    @staticmethod
    def _write(record: Dict[str, str], change: RecordChange, observe: Optional[Observe] = None) -> None:
        """Write ``change`` into ``record``; a size to record is observed once (skipped without ``observe``)."""
        if change.claims is not None:
            if change.claims:
                record[CLAIMS_KEY] = encode_claims(change.claims)
            else:
                record.pop(CLAIMS_KEY, None)
        sizes = ((BASELINE_KEY, change.baseline), (OUTSIDE_KEY, change.outside))
        observed: Optional[str] = None
        for key, size in sizes:
            if size is Size.FORGET:
                record.pop(key, None)
            elif size is Size.RECORD and observe is not None:
                observed = observed or encode_baseline(Baseline.from_state(observe()))
                record[key] = observed

    def _records(self, ref: ClusterRef, record: Dict[str, Any]) -> ClusterRecords:
        return ClusterRecords(
            claims=decode_claims(record.get(CLAIMS_KEY), source=f"{self.store.path(ref)} ({CLAIMS_KEY})"),
            baseline=self._size(ref, record, BASELINE_KEY),
            outside=self._size(ref, record, OUTSIDE_KEY),
        )

    def _size(self, ref: ClusterRef, record: Dict[str, Any], key: str) -> Optional[Baseline]:
        return decode_baseline(record.get(key), source=f"{self.store.path(ref)} ({key})")
