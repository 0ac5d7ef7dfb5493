"""The protocol for backends whose baselines and claims live in local files.

The scaler service cannot store anything with a cluster and local clusters
have no object, so both keep their records in a :class:`FileBookkeeping`
(one locked JSON record per cluster). Here the records hooks of
:class:`BaseBackend` and the decisions made on those records are done once:
a scale records the baseline (from the state it is about to change) before
the change; a restore puts back the baseline or target and then forgets the
baseline and every claim; a reconcile decides under the record's lock
between the largest claim and the baseline. A subclass says how to observe
and how to apply a size (``_observe_before_change``, ``_apply_size``,
``_apply_baseline``).
"""
import logging
from typing import Dict, Optional, Union

from ..filerecords import FileBookkeeping
from ..models import Baseline, ClusterState, ReplicaSpec, ScaleResult
from ..records import Claim
from ..refs import ClusterRef
from ..waiting import Deadline
from .base import BaseBackend, Change

logger = logging.getLogger("flytekitplugins_ddlscale.records")


class FileRecordsBackend(BaseBackend):
    """A :class:`BaseBackend` whose baselines and claims are in ``self.records``, a :class:`FileBookkeeping`."""

    records: FileBookkeeping

    # ------------------------------------------------------------- records

    def _record_baseline(self, ref: ClusterRef) -> Baseline:
        return self.records.record_baseline(ref, lambda: self._observe_for_baseline(ref))

    def _get_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        return self.records.get_baseline(ref)

    def _claim(self, ref: ClusterRef, claim_id: str, replicas: int, tier: Optional[str]) -> Claim:
        return self.records.claim(ref, claim_id, replicas, tier, observe=lambda: self._observe_for_baseline(ref))

    def _release(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        return self.records.release(ref, claim_id)

    def _claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        return self.records.claims(ref)

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
        self.records.forget_baseline(ref)
        stale = self.records.forget_claims(ref)
        if stale:
            logger.warning("%s: restore dropped claims %s", ref, ", ".join(sorted(stale)))
        return change

    def _reconcile_change(
        self, ref: ClusterRef, target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Union[Change, ScaleResult, None]:
        """Decided and applied under the record's lock, so claims and releases of other phases wait
        for the change (not for its wait); the baseline is forgotten once it is put back."""

        def act(claim: Optional[Claim], baseline: Optional[Baseline]) -> Union[Change, ScaleResult, None]:
            if claim is not None:
                previous = self._observe_before_change(ref, deadline, f"the reconcile of {ref}")
                self._check_size(previous, claim.replicas, False)
                unchanged = self._nothing_to_change(ref, previous, claim.replicas)
                if unchanged is not None:
                    return unchanged
                return self._apply_size(ref, claim.replicas, claim.worker_hw_tier, previous, deadline)
            if baseline is None:
                return None
            return self._apply_baseline(ref, baseline, target, deadline)

        return self.records.settle(ref, act)

    # --------------------------------------------------------------- hooks

    def _observe_for_baseline(self, ref: ClusterRef) -> ClusterState:
        """The state a baseline records when none is recorded yet."""
        return self._observe(ref)

    def _observe_before_change(self, ref: ClusterRef, deadline: Deadline, what: str) -> ClusterState:
        """The cluster just before a change (``what``, for a timeout while the backend is unreachable)."""
        raise NotImplementedError

    def _check_size(self, previous: ClusterState, replicas: int, strict: bool) -> None:
        """Refuse a size the cluster cannot take (``strict``: one above its maximum), changing nothing."""

    def _nothing_to_change(self, ref: ClusterRef, previous: ClusterState, replicas: int) -> Optional[ScaleResult]:
        """The result when setting ``replicas`` workers would change nothing and record no baseline."""
        return None

    def _apply_size(
        self, ref: ClusterRef, replicas: int, tier: Optional[str], previous: ClusterState, deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        """Set ``replicas`` workers (and ``tier``); do not wait."""
        raise NotImplementedError

    def _apply_baseline(
        self, ref: ClusterRef, baseline: Optional[Baseline], target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        """Put back ``target`` if given, else ``baseline``; do not wait (a :class:`Change` with ``restoring``)."""
        raise NotImplementedError

    def _no_baseline(self, ref: ClusterRef) -> ScaleResult:
        """What a restore without a recorded baseline or a target does."""
        raise NotImplementedError
