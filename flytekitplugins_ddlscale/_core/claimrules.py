"""The rules of claims, baselines and the size outside phases: pure decisions over a cluster's records.

Each store reads a :class:`ClusterRecords`, calls one rule and writes the :class:`RecordChange` it returns.
Only live leases count (:mod:`.leases`); the largest claim wins, the oldest on a tie. docs/reliability.md
(Claims as leases) tells the whole story.
"""
import datetime
import enum
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Tuple

from ..models import Baseline
from .leases import split_live
from .records import Claim


class Size(enum.Enum):
    """What a change does to a recorded size (the baseline, or the size outside phases)."""

    KEEP = "keep"
    RECORD = "record"
    """Record the cluster as it is now (only when none is recorded)."""
    FORGET = "forget"
    """Drop the record (only when one is recorded)."""


@dataclass(frozen=True)
class ClusterRecords:
    """What one cluster's records hold, as read from its store."""

    claims: Dict[str, Claim] = field(default_factory=dict)
    """Every claim on record by claim id, live or dead."""
    baseline: Optional[Baseline] = None
    outside: Optional[Baseline] = None
    """The size outside phases."""


@dataclass(frozen=True)
class RecordChange:
    """What a store writes after a rule: only what differs from the records it read."""

    claims: Optional[Dict[str, Claim]] = None
    """The claims to store in place of those read (empty: remove the record); None leaves them."""
    baseline: Size = Size.KEEP
    outside: Size = Size.KEEP
    dead: Dict[str, Tuple[Claim, str]] = field(default_factory=dict)
    """Dead claims this change drops, each with why (for the store to log with its holder)."""

    @property
    def writes(self) -> bool:
        """Whether the store has anything to write."""
        return self.claims is not None or self.baseline is not Size.KEEP or self.outside is not Size.KEEP


def live_claims(claims: Dict[str, Claim], now: Optional[datetime.datetime] = None) -> Dict[str, Claim]:
    """The claims that count, by claim id (dead ones are left for the next claim or reconcile to drop)."""
    return split_live(claims, now)[0]


def largest_claim(claims: Dict[str, Claim]) -> Optional[Claim]:
    """The claim with the most replicas (ties: the oldest, made first), or None when there are none."""
    if not claims:
        return None
    return max(claims.values(), key=lambda c: (c.replicas, -_moment(c.created_at)))


def _moment(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def baseline_before_change(records: ClusterRecords) -> Size:
    """What a change to the cluster (a scale, a head restart, holding a claim) does to the baseline:
    records it when none is recorded, else keeps the first one."""
    return Size.RECORD if records.baseline is None else Size.KEEP


def claim(records: ClusterRecords, new: Claim, now: Optional[datetime.datetime] = None) -> Tuple[RecordChange, Claim]:
    """Add ``new`` (or put it in place of its phase's live claim, keeping when that was made); the change
    and the largest live claim after it. The same change drops dead claims and records a missing
    baseline, and the size outside phases when no other phase is live, so a concurrent reconcile cannot
    forget a record the new claim relies on."""
    live, dead = split_live(records.claims, now)
    kept = live.get(new.claim_id)
    others = [key for key in live if key != new.claim_id]
    live[new.claim_id] = new if kept is None else replace(new, created_at=kept.created_at)
    first_phase = not others and records.outside is None
    change = RecordChange(
        claims=live, baseline=baseline_before_change(records),
        outside=Size.RECORD if first_phase else Size.KEEP, dead=dead,
    )
    largest = largest_claim(live)
    assert largest is not None
    return change, largest


def renew(claims: Dict[str, Claim], claim_id: str) -> Tuple[RecordChange, Optional[Claim]]:
    """Renew ``claim_id``'s lease from now, keeping when it was made; return the change and the renewed
    claim, or no change and None when it is gone (released, dropped by a restore or as dead)."""
    if claim_id not in claims:
        return RecordChange(), None
    renewed = claims[claim_id].renewed()
    return RecordChange(claims={**claims, claim_id: renewed}), renewed


def release(
    claims: Dict[str, Claim], claim_id: str, now: Optional[datetime.datetime] = None
) -> Tuple[RecordChange, Optional[Claim]]:
    """Drop ``claim_id`` (no change when absent; other dead claims are left for the reconcile that follows
    to drop and log); return the change and the largest remaining live claim, or None."""
    remaining = {key: value for key, value in claims.items() if key != claim_id}
    change = RecordChange(claims=remaining) if claim_id in claims else RecordChange()
    return change, largest_claim(live_claims(remaining, now))


def restore(records: ClusterRecords) -> Tuple[RecordChange, List[str]]:
    """What a restore does to the records: it ends every phase, so every claim (live or dead: claims of
    killed phases would inflate the next one) and both recorded sizes go; return the change and the
    ids of the claims it drops."""
    change = RecordChange(
        claims={} if records.claims else None,
        baseline=Size.KEEP if records.baseline is None else Size.FORGET,
        outside=Size.KEEP if records.outside is None else Size.FORGET,
    )
    return change, sorted(records.claims)


def same_size(first: Optional[Baseline], second: Optional[Baseline]) -> bool:
    """Whether two recorded sizes are the same cluster shape (workers and tiers; when recorded does not
    matter, nor the worker tier of no workers)."""
    if first is None or second is None:
        return first is second
    keys = ("replicas", "head_hw_tier") + (("worker_hw_tier",) if first.replicas else ())
    return all(getattr(first, key) == getattr(second, key) for key in keys)


SameTier = Callable[[str, Optional[str]], bool]
"""Whether a claim's worker tier NAME is the tier a recorded size shows (a name or a backend's tier id)."""


@dataclass(frozen=True)
class Settlement:
    """What a reconcile does, decided from one read of a cluster's records: while a claim is live, hold
    the largest (``hold``) at ``replicas`` (its count, or the size outside phases when larger on its
    tier); with none live, put back ``restore_to`` (the size outside phases, else the baseline). ``dead``
    are the claims to drop, with why; ``change`` is what the store writes once the request was sent.
    """

    live: Dict[str, Claim]
    dead: Dict[str, Tuple[Claim, str]]
    hold: Optional[Claim]
    replicas: int
    restore_to: Optional[Baseline]
    change: RecordChange


def settle(records: ClusterRecords, same_tier: SameTier, now: Optional[datetime.datetime] = None) -> Settlement:
    """The :class:`Settlement` of ``records``: the largest live claim over the size outside phases, or,
    with none live, the size to put back."""
    live, dead = split_live(records.claims, now)
    hold = largest_claim(live)
    outside, baseline = records.outside, records.baseline
    restore_to = outside if outside is not None else baseline
    claims = live if dead else None
    if hold is not None:
        replicas = hold.replicas
        observed = restore_to.worker_hw_tier if restore_to is not None else None
        floor_applies = hold.worker_hw_tier is None or same_tier(hold.worker_hw_tier, observed)
        if restore_to is not None and floor_applies:
            replicas = max(replicas, restore_to.replicas)
        change = RecordChange(claims=claims, baseline=baseline_before_change(records), dead=dead)
        return Settlement(live, dead, hold, replicas, restore_to, change)
    forget_baseline = baseline is not None and (outside is None or same_size(outside, baseline))
    change = RecordChange(
        claims=claims, baseline=Size.FORGET if forget_baseline else Size.KEEP,
        outside=Size.KEEP if outside is None else Size.FORGET, dead=dead,
    )
    return Settlement(live, dead, None, 0, restore_to, change)
