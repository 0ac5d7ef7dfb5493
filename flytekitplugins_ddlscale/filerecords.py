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
from .models import Baseline, ClusterState
from .records import Claim, decode_baseline, decode_claims, encode_baseline, encode_claims, largest_claim
from .refs import ClusterRef
from .validation import validate_claim_id, validate_replicas, validate_tier_name

T = TypeVar("T")
BASELINE_KEY = "baseline"
CLAIMS_KEY = "claims"


class FileBookkeeping:
    """Baselines and claims of clusters, kept in a :class:`FileRecordStore`."""

    def __init__(self, store: Optional[FileRecordStore] = None) -> None:
        self.store = store if store is not None else FileRecordStore()

    def get_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        """The recorded baseline of ``ref``, or None."""
        return self._baseline(ref, self.store.read(ref))

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
        """Drop the recorded baseline; return what it was (None if there was none)."""
        return self.store.update(ref, lambda record: self._baseline(ref, {BASELINE_KEY: record.pop(BASELINE_KEY, None)}))

    def forget_claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """Drop every claim of ``ref`` (e.g. left by killed processes); return what they were."""
        return self.store.update(ref, lambda record: self._claims(ref, {CLAIMS_KEY: record.pop(CLAIMS_KEY, None)}))

    def claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """Live claims of ``ref`` by claim id."""
        return self._claims(ref, self.store.read(ref))

    def claim(
        self,
        ref: ClusterRef,
        claim_id: str,
        replicas: int,
        worker_hw_tier: Optional[str] = None,
        observe: Optional[Callable[[], ClusterState]] = None,
    ) -> Claim:
        """Add or replace ``claim_id``'s claim; return the largest live claim.

        With ``observe``, a missing baseline is recorded from ``observe()`` in
        the same locked update, so a concurrent :meth:`settle` cannot forget
        the baseline between the two. Raises :class:`InvalidInputError` for a
        bad id, replica count or tier before anything is written.
        """
        validate_claim_id(claim_id)
        validate_replicas(replicas)
        tier = validate_tier_name(worker_hw_tier)

        def change(record: Dict[str, str]) -> Claim:
            if observe is not None and self._baseline(ref, record) is None:
                record[BASELINE_KEY] = encode_baseline(Baseline.from_state(observe()))
            claims = self._claims(ref, record)
            claims[claim_id] = Claim(claim_id=claim_id, replicas=replicas, worker_hw_tier=tier)
            record[CLAIMS_KEY] = encode_claims(claims)
            return largest_claim(claims)  # type: ignore[return-value]

        return self.store.update(ref, change)

    def release(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Drop ``claim_id`` (no error if absent); return the largest remaining claim, or None."""
        validate_claim_id(claim_id)

        def change(record: Dict[str, str]) -> Optional[Claim]:
            claims = self._claims(ref, record)
            claims.pop(claim_id, None)
            if claims:
                record[CLAIMS_KEY] = encode_claims(claims)
            else:
                record.pop(CLAIMS_KEY, None)
            return largest_claim(claims)

        return self.store.update(ref, change)

    def settle(self, ref: ClusterRef, act: Callable[[Optional[Claim], Optional[Baseline]], T]) -> T:
        """Call ``act(largest live claim, recorded baseline)`` under the record's lock; return its result.

        Claims and releases of ``ref`` wait until ``act`` returns, so what it
        changes matches the claims it was given. When no claim is live and
        ``act`` returns normally, the baseline is forgotten (it was restored);
        when ``act`` raises, the record is left as it was.
        """

        def change(record: Dict[str, str]) -> T:
            largest = largest_claim(self._claims(ref, record))
            result = act(largest, self._baseline(ref, record))
            if largest is None:
                record.pop(BASELINE_KEY, None)
            return result

        return self.store.update(ref, change)

    def _baseline(self, ref: ClusterRef, record: Dict[str, Any]) -> Optional[Baseline]:
        return decode_baseline(record.get(BASELINE_KEY), source=f"{self.store.path(ref)} ({BASELINE_KEY})")

    def _claims(self, ref: ClusterRef, record: Dict[str, Any]) -> Dict[str, Claim]:
        return decode_claims(record.get(CLAIMS_KEY), source=f"{self.store.path(ref)} ({CLAIMS_KEY})")
