"""The backend contract: what every way of reaching a cluster must offer.

``ScaleCluster``, ``RestartHead``, ``@distributed_phase`` and the CLI speak
only this protocol, so the scaler service, Kubernetes and the local backend
are interchangeable behind them.
"""
from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Protocol, runtime_checkable

from ..models import Baseline, ClusterState, ReplicaSpec, RestartResult, ScaleResult
from ..progress import ProgressReporter
from ..records import Claim
from ..refs import ClusterRef

DEFAULT_SCALE_TIMEOUT = 900.0
"""Seconds a scale waits for workers by default: GPU nodes can take minutes to join."""
DEFAULT_RESTART_TIMEOUT = 600.0
"""Seconds a head restart waits for the new head by default."""


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend can and cannot do, so callers can adapt instead of guessing."""

    kinds: FrozenSet[str]
    """Short kinds it serves (``ray``, ``spark``, ``dask``, ``mpi``)."""
    observes_readiness: bool
    """Whether ``ClusterState.ready_workers`` is real pod readiness."""
    holds_size: bool
    """Whether a scale also holds the size against the cluster's autoscaler."""
    head_tier: bool
    """Whether ``restart_head(head_hw_tier=...)`` can change the head's tier."""
    persistent_baseline: bool
    """Whether the baseline survives this process (stored with the cluster)."""


@runtime_checkable
class ClusterBackend(Protocol):
    """One way to read and resize distributed-compute clusters."""

    name: str
    capabilities: BackendCapabilities

    def get_state(self, ref: ClusterRef) -> ClusterState:
        """Observe the cluster now."""
        ...

    def scale(
        self,
        ref: ClusterRef,
        replicas: int,
        worker_hw_tier: Optional[str] = None,
        *,
        wait: bool = True,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        strict: bool = False,
        progress: Optional[ProgressReporter] = None,
    ) -> ScaleResult:
        """Set the worker count (and tier); with ``wait``, return once they are up.

        Records the baseline first if none is recorded. ``strict`` refuses a
        request above ``maxReplicas`` instead of capping it. Invalid input
        raises :class:`InvalidInputError` before any request is sent. If the
        wait times out or a worker cannot start, the change stays in place and
        the error names it and the command that restores the baseline
        (:mod:`flytekitplugins_ddlscale.inplace`); the same holds for
        :meth:`restore_baseline` and :meth:`reconcile`.
        """
        ...

    def wait_for_workers(
        self,
        ref: ClusterRef,
        replicas: int,
        *,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        progress: Optional[ProgressReporter] = None,
    ) -> ClusterState:
        """Return once ``replicas`` workers are up; raise ``ScalingTimeoutError`` at ``timeout``.

        A count above the desired one or the maximum raises
        ``UnreachableWaitError`` at once: such a wait could never end.
        """
        ...

    def restart_head(
        self,
        ref: ClusterRef,
        head_hw_tier: Optional[str] = None,
        *,
        wait: bool = True,
        timeout: float = DEFAULT_RESTART_TIMEOUT,
        progress: Optional[ProgressReporter] = None,
    ) -> RestartResult:
        """Replace the head pod (on a new tier if given); with ``wait``, until it is Ready."""
        ...

    def record_baseline(self, ref: ClusterRef) -> Baseline:
        """Record the cluster's current size and tiers unless already recorded; return the baseline."""
        ...

    def get_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        """The recorded baseline, or None."""
        ...

    def restore_baseline(
        self,
        ref: ClusterRef,
        target: Optional[ReplicaSpec] = None,
        *,
        wait: bool = True,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        progress: Optional[ProgressReporter] = None,
    ) -> ScaleResult:
        """Put the cluster back to the recorded baseline (or ``target``) and forget the baseline."""
        ...

    def claim(
        self, ref: ClusterRef, claim_id: str, replicas: int, worker_hw_tier: Optional[str] = None
    ) -> Claim:
        """Register that ``claim_id`` needs ``replicas`` workers; return the largest live claim.

        Records the baseline first if none is recorded, in the same atomic
        step as the claim, so a concurrent :meth:`reconcile` never forgets a
        baseline that a new claim relies on. Phases then :meth:`reconcile`.
        """
        ...

    def reconcile(
        self,
        ref: ClusterRef,
        target: Optional[ReplicaSpec] = None,
        *,
        wait: bool = True,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        progress: Optional[ProgressReporter] = None,
    ) -> Optional[ScaleResult]:
        """Scale to the largest live claim (its replicas and its tier), or, when no claim
        remains, restore the recorded baseline (or ``target`` instead) and forget the baseline.

        The decision and the change are atomic with respect to concurrent
        :meth:`claim`/:meth:`release` (one resourceVersion-checked patch, or
        the scale request sent under the cluster's record lock), so a phase
        ending never shrinks a phase that has just claimed. With ``wait``,
        returns once the workers are up. Returns None when there was nothing
        to do (no claim and no baseline).
        """
        ...

    def release(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Drop ``claim_id``; return the largest remaining claim, or None when none remain."""
        ...

    def claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """The live claims of ``ref`` by claim id (empty when none)."""
        ...

    def close(self) -> None:
        """Release connections and background resources."""
        ...
