"""A :class:`ClusterBackend` whose baselines and claims live in local files (a :class:`FileBookkeeping`),
for the scaler service and local clusters: the records hooks and the three changes are done here once; a
subclass says how to observe and set a size (docs/backends.md). A reconcile decides and sends under the
record's lock, never waits there: a step that meets an outage gives the lock back and decides again.
"""
import abc
import logging
import time
from typing import Dict, Optional, Union

from ..errors import InvalidInputError, ScalingTimeoutError, TransientError
from ._support.filerecords import FileBookkeeping
from ..models import Baseline, ClusterState, ReplicaSpec, ScaleResult
from .._core.outage import OUTAGE_BACKOFF
from .._core.claimrules import Settlement
from .._core.records import Claim
from ..refs import ClusterRef
from .._core.waiting import Deadline
from ._base import Change, ClusterBackend

logger = logging.getLogger("flytekitplugins_ddlscale._core.records")

LOCKED_STEP_SECONDS = 10.0
"""Longest a reconcile step may hold the record lock (reading the records, deciding, sending the one
change): an outage longer than this is ridden out with the lock given back."""


class FileRecordsBackend(ClusterBackend):
    """A :class:`ClusterBackend` whose baselines and claims are in ``self.records``, a :class:`FileBookkeeping`."""

    records: FileBookkeeping
    locked_step_seconds: Optional[float] = LOCKED_STEP_SECONDS
    """Longest one reconcile step holds the record lock (:data:`LOCKED_STEP_SECONDS`); None for a backend
    whose changes meet no outage (its step is the operation and a failure is final)."""

    # ------------------------------------------------------------- records

    def _record_baseline(self, ref: ClusterRef) -> Baseline:
        return self.records.record_baseline(ref, lambda: self._observe_for_baseline(ref))

    def _get_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        return self.records.get_baseline(ref)

    def _claim(
        self, ref: ClusterRef, claim_id: str, replicas: int, tier: Optional[str], lease_seconds: float,
        timeout: Optional[float],
    ) -> Claim:
        new = Claim(claim_id, replicas, tier, lease_seconds=lease_seconds)
        return self.records.claim(ref, new, lambda: self._observe_for_baseline(ref), timeout=timeout)

    def _renew(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        return self.records.renew(ref, claim_id)

    def _release(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        return self.records.release(ref, claim_id)

    def _claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        return self.records.claims(ref)

    def _recorded_claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        return self.records.recorded_claims(ref)

    # ------------------------------------------------- decisions on records

    def _scale_change(
        self, ref: ClusterRef, replicas: int, tier: Optional[str], strict: bool, deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        previous = self._observe_before_change(ref, deadline, f"the scale request to {replicas} workers of {ref}")
        self._check_size(previous, replicas, strict)
        unchanged = self._nothing_to_change(ref, previous, replicas)
        if unchanged is not None:
            return unchanged
        self.records.record_baseline(ref, lambda: previous)
        return self._apply_size(ref, replicas, tier, previous, deadline)

    def _restore_change(
        self, ref: ClusterRef, target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        baseline = self.records.get_baseline(ref)
        change = (
            self._no_baseline(ref) if target is None and baseline is None
            else self._apply_baseline(ref, baseline, target, deadline)
        )
        _, stale = self.records.restore(ref)
        if stale:
            logger.warning("%s: restore dropped claims %s", ref, ", ".join(sorted(stale)))
        return change

    def _reconcile_change(
        self, ref: ClusterRef, target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Union[Change, ScaleResult, None]:
        """Decided and sent under the record's lock, so claims and releases of other phases wait for
        the decision and the request, never for an outage or the wait for workers; the size outside
        phases is forgotten once it is put back."""
        pauses = OUTAGE_BACKOFF.intervals()
        while True:
            # Read (riding out an outage) before taking the lock; under it, each step is bounded.
            previous = self._observe_before_change(ref, deadline, f"the reconcile of {ref}")
            bound = self.locked_step_seconds
            step = deadline if bound is None else Deadline(max(min(deadline.remaining, bound), 0.1))
            try:
                return self.records.settle(
                    ref, lambda decided: self._settle_step(ref, decided, target, previous, step),
                    same_tier=lambda name, observed: self._same_tier(ref, name, observed),
                    timeout=max(deadline.remaining, 0.1), observe=lambda: previous,
                )
            except (TransientError, ScalingTimeoutError) as error:
                # Only an outage that outlasted the locked step goes on outside the lock; what would
                # have failed anyway (bounded retries spent before the step ended) still fails.
                if step is deadline or not step.expired or deadline.expired:
                    raise
                logger.info("%s: the reconcile met an outage (%s); deciding again once it is over", ref, error)
                time.sleep(min(next(pauses), deadline.remaining))

    def _settle_step(
        self, ref: ClusterRef, decided: Settlement, target: Optional[ReplicaSpec], previous: ClusterState,
        step: Deadline,
    ) -> Union[Change, ScaleResult, None]:
        if decided.hold is not None:
            self._check_size(previous, decided.replicas, False)
            unchanged = self._nothing_to_change(ref, previous, decided.replicas)
            if unchanged is not None:
                return unchanged
            return self._apply_size(ref, decided.replicas, decided.hold.worker_hw_tier, previous, step)
        if decided.restore_to is None:
            return None
        return self._apply_baseline(ref, decided.restore_to, target, step)

    # --------------------------------------------------------------- hooks

    def _observe_for_baseline(self, ref: ClusterRef) -> ClusterState:
        """The state a baseline records when none is recorded yet."""
        return self._observe(ref)

    @abc.abstractmethod
    def _observe_before_change(self, ref: ClusterRef, deadline: Deadline, what: str) -> ClusterState:
        """The cluster just before a change (``what``, for a timeout while the backend is unreachable)."""

    def _check_size(self, previous: ClusterState, replicas: int, strict: bool) -> None:
        """Refuse a size the cluster cannot take (``strict``: one above its maximum), changing nothing."""

    def _nothing_to_change(self, ref: ClusterRef, previous: ClusterState, replicas: int) -> Optional[ScaleResult]:
        """The result when setting ``replicas`` workers would change nothing and record no baseline."""
        return None

    @abc.abstractmethod
    def _apply_size(
        self, ref: ClusterRef, replicas: int, tier: Optional[str], previous: ClusterState, deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        """Set ``replicas`` workers (and ``tier``); do not wait."""

    @abc.abstractmethod
    def _apply_baseline(
        self, ref: ClusterRef, baseline: Optional[Baseline], target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        """Put back ``target`` if given, else ``baseline``; do not wait (a :class:`Change` with ``restoring``)."""

    def _no_baseline(self, ref: ClusterRef) -> ScaleResult:
        """What a restore without a recorded baseline or a target does: refuse it, naming ``target``."""
        raise InvalidInputError("target", None, f"a ReplicaSpec, since no baseline is recorded for {ref}")
