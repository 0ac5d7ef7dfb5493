"""What every scaling node's typed output is: a small dataclass Flyte can pass between nodes.

Each node type's outcome lives in its own module. Flat fields of plain
types only (no nested states, no datetimes), so they serialize the same
under every flytekit dataclass transformer and a downstream node can bind
to a single field (``up.effective``).
"""
from dataclasses import dataclass
from typing import Any, Dict, Optional

from ...models import ClusterState, ScaleResult
from ..._core.timeline import observed_workers
from ..readiness import Readiness

UNKNOWN = -1
"""Stands for "not observable by this backend" in integer fields (Flyte-friendly None)."""


@dataclass
class NodeOutcome:
    """What every node's outcome starts with: the cluster it acted on and the backend that did it."""

    cluster: str
    """The cluster as ``[namespace/]kind/name``."""
    backend: str
    """The backend's name, e.g. ``kubernetes``."""


def known(value: Optional[int]) -> int:
    """``value``, or :data:`UNKNOWN` for None."""
    return UNKNOWN if value is None else value


def resized(result: ScaleResult, backend: str) -> Dict[str, Any]:
    """The fields every outcome of a size change (a scale, a restore) takes from ``result`` and ``backend``."""
    return dict(
        cluster=result.cluster,
        backend=backend,
        previous_workers=result.previous.desired_workers,
        workers=result.final.desired_workers,
        ready_workers=known(result.final.ready_workers),
        waited=result.waited,
        seconds_waited=result.seconds_waited,
        worker_hw_tier=result.worker_hw_tier or "",
    )


def ready_count(state: ClusterState, readiness: Optional[Readiness]) -> int:
    """The workers to plot as ready at the end: the confirmed readiness's count where known, else what ``state`` saw."""
    if readiness is not None and readiness.ready_workers is not None:
        return readiness.ready_workers
    return observed_workers(state)
