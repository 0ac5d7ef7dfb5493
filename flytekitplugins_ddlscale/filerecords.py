"""Baseline and claim bookkeeping on a :class:`FileRecordStore`.

For backends that cannot store records with the cluster (the scaler service
only patches replicas; local clusters have no object). Each operation is one
locked read-modify-write of the cluster's record, so concurrent processes on
one machine agree. Records keep the same JSON encoding as the Kubernetes
annotations (:mod:`.records`).
"""
from typing import Callable, Dict, Optional, TypeVar

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
        return decode_baseline(self.store.get(ref, BASELINE_KEY))

    def record_baseline(self, ref: ClusterRef, observe: Callable[[], ClusterState]) -> Baseline:
        """The recorded baseline; if there is none, record ``Baseline.from_state(observe())``.

        ``observe`` runs under the record's lock, so two processes racing to
        record see one observation win and both get that baseline.
        """

        def change(record: Dict[str, str]) -> Baseline:
            existing = decode_baseline(record.get(BASELINE_KEY))
            if existing is not None:
                return existing
            baseline = Baseline.from_state(observe())
            record[BASELINE_KEY] = encode_baseline(baseline)
            return baseline

        return self.store.update(ref, change)

    def forget_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        """Drop the recorded baseline; return what it was (None if there was none)."""
        return self.store.update(ref, lambda record: decode_baseline(record.pop(BASELINE_KEY, None)))

    def forget_claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """Drop every claim of ``ref`` (e.g. left by killed processes); return what they were."""
        return self.store.update(ref, lambda record: decode_claims(record.pop(CLAIMS_KEY, None)))

    def claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """Live claims of ``ref`` by claim id."""
        return decode_claims(self.store.get(ref, CLAIMS_KEY))

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
            if observe is not None and decode_baseline(record.get(BASELINE_KEY)) is None:
                record[BASELINE_KEY] = encode_baseline(Baseline.from_state(observe()))
            claims = decode_claims(record.get(CLAIMS_KEY))
            claims[claim_id] = Claim(claim_id=claim_id, replicas=replicas, worker_hw_tier=tier)
            record[CLAIMS_KEY] = encode_claims(claims)
            return largest_claim(claims)  # type: ignore[return-value]

        return self.store.update(ref, change)

    def release(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Drop ``claim_id`` (no error if absent); return the largest remaining claim, or None."""
        validate_claim_id(claim_id)

        def change(record: Dict[str, str]) -> Optional[Claim]:
            claims = decode_claims(record.get(CLAIMS_KEY))
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
            largest = largest_claim(decode_claims(record.get(CLAIMS_KEY)))
            result = act(largest, decode_baseline(record.get(BASELINE_KEY)))
            if largest is None:
                record.pop(BASELINE_KEY, None)
            return result

        return self.store.update(ref, change)
