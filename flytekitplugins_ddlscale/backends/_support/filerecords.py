"""Baseline and claim bookkeeping on a :class:`FileRecordStore`.

For backends that cannot store records with the cluster (the scaler service
only patches replicas; local clusters have no object). Each operation is one
locked read-modify-write of the cluster's record, so concurrent processes on
one machine agree. Records keep the same JSON encoding as the Kubernetes
annotations (:mod:`.records`); what is read back is checked as user input is,
so a corrupt record raises :class:`CorruptRecordError` naming its file before
anything acts on it.
"""
from typing import Any, Callable, Dict, Optional, TypeVar

from .filestore import FileRecordStore
from ..._core.leases import DEFAULT_LEASE_SECONDS, log_dropped, split_live
from ...models import Baseline, ClusterState
from ..._core.records import (
    Claim,
    SameTier,
    Settlement,
    decode_baseline,
    decode_claims,
    encode_baseline,
    encode_claims,
    largest_claim,
    settle,
)
from ...refs import ClusterRef
from ..._core.validation import validate_claim_id, validate_replicas, validate_tier_name

T = TypeVar("T")
BASELINE_KEY = "baseline"
CLAIMS_KEY = "claims"
OUTSIDE_KEY = "outside_phases"
RENEW_LOCK_TIMEOUT = 10.0
"""Seconds a renewal waits for the record lock: a renewal that cannot get it is tried again at the next
tick, well within the lease, instead of holding up the phase's cleanup."""


def _exactly(name: str, observed: Optional[str]) -> bool:
    return name == observed


class FileBookkeeping:
    """Baselines, claims and the size outside phases of clusters, kept in a :class:`FileRecordStore`.

    Claims are leases (:mod:`.leases`): dead ones are not counted, and a
    claim or settle drops them from the record (logged with their holder).
    """

    def __init__(self, store: Optional[FileRecordStore] = None) -> None:
        self.store = store if store is not None else FileRecordStore()

    def get_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        """The recorded baseline of ``ref``, or None."""
        return self._baseline(ref, self.store.read(ref))

    def get_outside(self, ref: ClusterRef) -> Optional[Baseline]:
        """The size ``ref`` had outside phases, recorded when the first live phase claimed; None when
        no phase is live or unrestored."""
        return self._outside(ref, self.store.read(ref))

    def record_baseline(self, ref: ClusterRef, observe: Callable[[], ClusterState]) -> Baseline:
        """The recorded baseline; if there is none, record ``Baseline.from_state(observe())``.

        ``observe`` runs under the record's lock, so two processes racing to
        record see one observation win and both get that baseline.
        """

        def change(record: Dict[str, str]) -> Baseline:
            existing = self._baseline(ref, record)
            if existing is not None:
                return existing
            baseline = Baseline.from_state(observe())
            record[BASELINE_KEY] = encode_baseline(baseline)
            return baseline

        return self.store.update(ref, change)

    def forget_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        """Drop the recorded baseline (and the size outside phases); return what the baseline was."""

        def change(record: Dict[str, str]) -> Optional[Baseline]:
            record.pop(OUTSIDE_KEY, None)
            return self._baseline(ref, {BASELINE_KEY: record.pop(BASELINE_KEY, None)})

        return self.store.update(ref, change)

    def forget_claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """Drop every claim of ``ref``, live or not; return what they were."""
        return self.store.update(ref, lambda record: self._claims(ref, {CLAIMS_KEY: record.pop(CLAIMS_KEY, None)}))

    def claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """Live claims of ``ref`` by claim id (dead ones are left for the next claim or settle to drop)."""
        return split_live(self._claims(ref, self.store.read(ref)))[0]

    def claim(
        self,
        ref: ClusterRef,
        claim_id: str,
        replicas: int,
        worker_hw_tier: Optional[str] = None,
        observe: Optional[Callable[[], ClusterState]] = None,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        timeout: Optional[float] = None,
    ) -> Claim:
        """Add or replace ``claim_id``'s claim (a lease of ``lease_seconds``); return the largest live claim.

        In the same locked update (waiting at most ``timeout`` seconds for the
        lock, else the store's own bound), dead claims are dropped and, with
        ``observe``, a missing baseline is recorded from ``observe()``, and so
        is the size outside phases when no other claim is live and none is
        recorded; so a concurrent :meth:`settle` cannot forget a record the
        new claim relies on. Raises :class:`InvalidInputError` for a bad id,
        replica count or tier before anything is written.
        """
        validate_claim_id(claim_id)
        validate_replicas(replicas)
        tier = validate_tier_name(worker_hw_tier)

        def change(record: Dict[str, str]) -> Claim:
            live, dead = split_live(self._claims(ref, record))
            log_dropped(str(ref), dead)
            others = {key: claim for key, claim in live.items() if key != claim_id}
            if observe is not None:
                self._record_sizes(ref, record, observe, first_phase=not others)
            kept = live.get(claim_id)
            live[claim_id] = Claim(
                claim_id=claim_id, replicas=replicas, worker_hw_tier=tier, lease_seconds=lease_seconds,
                **({"created_at": kept.created_at} if kept is not None else {}),
            )
            record[CLAIMS_KEY] = encode_claims(live)
            return largest_claim(live)  # type: ignore[return-value]

        return self.store.update(ref, change, timeout=timeout)

    def renew(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Renew ``claim_id``'s lease from now; return the renewed claim, or None when it is gone (released,
        dropped by ``ddlscale restore``, or dropped as dead)."""
        validate_claim_id(claim_id)

        def change(record: Dict[str, str]) -> Optional[Claim]:
            claims = self._claims(ref, record)
            if claim_id not in claims:
                return None
            claims[claim_id] = claims[claim_id].renewed()
            record[CLAIMS_KEY] = encode_claims(claims)
            return claims[claim_id]

        return self.store.update(ref, change, timeout=RENEW_LOCK_TIMEOUT)

    def release(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Drop ``claim_id`` (no error if absent); return the largest remaining live claim, or None."""
        validate_claim_id(claim_id)

        def change(record: Dict[str, str]) -> Optional[Claim]:
            claims = self._claims(ref, record)
            claims.pop(claim_id, None)
            if claims:
                record[CLAIMS_KEY] = encode_claims(claims)
            else:
                record.pop(CLAIMS_KEY, None)
            return largest_claim(split_live(claims)[0])

        return self.store.update(ref, change)

    def settle(
        self, ref: ClusterRef, act: Callable[[Settlement], T], same_tier: SameTier = _exactly,
        timeout: Optional[float] = None,
    ) -> T:
        """Call ``act`` with the :class:`Settlement` of the record under its lock; return its result.

        Claims and releases of ``ref`` wait until ``act`` returns, so what it
        changes matches the claims it was given: ``act`` must only decide and
        send the change, never wait. Dead claims are dropped (and logged).
        When no claim is live and ``act`` returns normally, the size outside
        phases is forgotten (it was restored), and the baseline with it when
        the settlement says so; when ``act`` raises, the record is left as it
        was.
        """

        def change(record: Dict[str, str]) -> T:
            decided = settle(self._claims(ref, record), self._outside(ref, record), self._baseline(ref, record), same_tier)
            result = act(decided)
            log_dropped(str(ref), decided.dead)
            if decided.live:
                record[CLAIMS_KEY] = encode_claims(decided.live)
            else:
                record.pop(CLAIMS_KEY, None)
                record.pop(OUTSIDE_KEY, None)
                if decided.forget_baseline:
                    record.pop(BASELINE_KEY, None)
            return result

        return self.store.update(ref, change, timeout=timeout)

    def _record_sizes(
        self, ref: ClusterRef, record: Dict[str, str], observe: Callable[[], ClusterState], first_phase: bool
    ) -> None:
        baseline = self._baseline(ref, record)
        missing_outside = first_phase and self._outside(ref, record) is None
        if baseline is not None and not missing_outside:
            return
        now = Baseline.from_state(observe())
        if baseline is None:
            record[BASELINE_KEY] = encode_baseline(now)
        if missing_outside:
            record[OUTSIDE_KEY] = encode_baseline(now)

    def _baseline(self, ref: ClusterRef, record: Dict[str, Any]) -> Optional[Baseline]:
        return decode_baseline(record.get(BASELINE_KEY), source=f"{self.store.path(ref)} ({BASELINE_KEY})")

    def _outside(self, ref: ClusterRef, record: Dict[str, Any]) -> Optional[Baseline]:
        return decode_baseline(record.get(OUTSIDE_KEY), source=f"{self.store.path(ref)} ({OUTSIDE_KEY})")

    def _claims(self, ref: ClusterRef, record: Dict[str, Any]) -> Dict[str, Claim]:
        return decode_claims(record.get(CLAIMS_KEY), source=f"{self.store.path(ref)} ({CLAIMS_KEY})")
