"""Typed outputs of the scaling task types: small dataclasses Flyte can pass between nodes.

Flat fields of plain types only (no nested states, no datetimes), so they
serialize the same under every flytekit dataclass transformer and a
downstream node can bind to a single field (``up.effective``).
"""
from dataclasses import dataclass
from typing import Optional

from ..readiness import Readiness
from ...models import ClusterState, RestartResult, ScaleResult

UNKNOWN = -1
"""Stands for "not observable by this backend" in integer fields (Flyte-friendly None)."""


@dataclass
class ScaleOutcome:
    """What a ``ScaleCluster`` node did."""

    cluster: str
    """The cluster as ``[namespace/]kind/name``."""
    backend: str
    requested: int
    effective: int
    """Workers the backend set: ``min(requested, maxReplicas)`` unless strict."""
    capped: bool
    previous_workers: int
    """``spec.worker.replicas`` before the change."""
    workers: int
    """``spec.worker.replicas`` after the change."""
    ready_workers: int
    """Ready workers at the end: pods Ready where the backend sees readiness, else the workers
    registered with the framework where that was checked; ``UNKNOWN`` (-1) otherwise."""
    waited: bool
    seconds_waited: float
    worker_hw_tier: str = ""
    """The requested worker tier, or '' when none was asked for."""
    readiness: str = ""
    """Which checks proved readiness, e.g. ``4 worker pods exist (scaler; ...); 4 workers
    registered with the Dask scheduler at http://h:8787``; '' when not waited."""

    @classmethod
    def from_result(cls, result: ScaleResult, backend: str, readiness: Optional[Readiness] = None) -> "ScaleOutcome":
        """The outcome of ``result`` from backend ``backend``, with the readiness that was confirmed."""
        ready = readiness.ready_workers if readiness is not None else result.final.ready_workers
        return cls(
            cluster=result.cluster,
            backend=backend,
            requested=result.requested,
            effective=result.effective,
            capped=result.capped,
            previous_workers=result.previous.desired_workers,
            workers=result.final.desired_workers,
            ready_workers=_known(ready),
            waited=result.waited,
            seconds_waited=result.seconds_waited + (readiness.seconds if readiness is not None else 0.0),
            worker_hw_tier=result.worker_hw_tier or "",
            readiness=readiness.proof if readiness is not None else "",
        )


@dataclass
class RestartOutcome:
    """What a ``RestartHead`` node did."""

    cluster: str
    backend: str
    pod: str
    started_at: str
    ready: bool
    waited: bool
    seconds_waited: float
    head_hw_tier: str = ""

    @classmethod
    def from_result(cls, result: RestartResult, backend: str) -> "RestartOutcome":
        """The outcome of ``result`` from backend ``backend``."""
        return cls(
            cluster=result.cluster,
            backend=backend,
            pod=result.pod,
            started_at=result.started_at,
            ready=result.ready,
            waited=result.waited,
            seconds_waited=result.seconds_waited,
            head_hw_tier=result.head_hw_tier or "",
        )


@dataclass
class ClusterReady:
    """What a ``WaitForCluster`` node saw when the workers were up."""

    cluster: str
    backend: str
    status: str
    workers: int
    ready_workers: int
    """As in :class:`ScaleOutcome`: pods Ready, else framework-registered workers, else ``UNKNOWN`` (-1)."""
    seconds_waited: float
    readiness: str = ""
    """Which checks proved readiness (see :class:`ScaleOutcome`)."""

    @classmethod
    def from_state(
        cls, state: ClusterState, backend: str, seconds_waited: float, readiness: Optional[Readiness] = None
    ) -> "ClusterReady":
        """The outcome of a wait that ended in ``state``, with the readiness that was confirmed."""
        return cls(
            cluster=state.cluster,
            backend=backend,
            status=state.status,
            workers=state.desired_workers,
            ready_workers=_known(readiness.ready_workers if readiness is not None else state.ready_workers),
            seconds_waited=seconds_waited,
            readiness=readiness.proof if readiness is not None else "",
        )


@dataclass
class RestoreOutcome:
    """What a ``RestoreCluster`` node did."""

    cluster: str
    backend: str
    restored: str
    """``baseline``, ``given size``, or ``nothing recorded`` (no baseline and no size: unchanged)."""
    previous_workers: int
    workers: int
    """``spec.worker.replicas`` after the restore (0 for a local cluster taken down)."""
    ready_workers: int
    """``UNKNOWN`` (-1) where the backend cannot see readiness."""
    waited: bool
    seconds_waited: float
    worker_hw_tier: str = ""
    """The tier restored to, or '' when none was named."""

    @classmethod
    def from_result(cls, result: ScaleResult, backend: str, restored: str) -> "RestoreOutcome":
        """The outcome of the restore ``result`` (from ``restore_baseline``) on ``backend``."""
        return cls(
            cluster=result.cluster,
            backend=backend,
            restored=restored,
            previous_workers=result.previous.desired_workers,
            workers=result.final.desired_workers,
            ready_workers=_known(result.final.ready_workers),
            waited=result.waited,
            seconds_waited=result.seconds_waited,
            worker_hw_tier=result.worker_hw_tier or "",
        )


def _known(value: Optional[int]) -> int:
    return UNKNOWN if value is None else value
