"""The ``ScaleCluster`` node type: set a cluster's worker count (and tiers), then wait for the workers."""
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ...backends._base import DEFAULT_SCALE_TIMEOUT
from ...errors import InvalidInputError, UnsupportedOperationError
from ...models import ClusterState, ScaleResult
from ...refs import parse_cluster
from ..hold.settings import SizedCluster
from ..._core.progress import ProgressReporter, begin_wait
from ..._core.summary import above, arrived, found, framework_note, tier_note, took, workers
from ..._core.timeline import WorkerTimeline, observed_workers, recording
from ..._core.validation import validate_replicas, validate_tier_name
from ..._core.waiting import Deadline
from ..opening import open_backend
from ..readiness import Readiness, ReadinessCheck
from .kinds import (
    CREATE_TIMEOUT, ChecksFramework, Creation, NodeConfig, NodeKind, NodeOutcome, Sent, known,
    ready_count, resized,
)
from .names import SCALE_TASK_TYPE


@dataclass(frozen=True)
class ScaleConfig(NodeConfig, SizedCluster, ChecksFramework):
    """Defaults and behaviour of a ``ScaleCluster`` task: the cluster and size it sets, then these."""

    wait: bool = True
    timeout: float = DEFAULT_SCALE_TIMEOUT
    strict: bool = False
    backend: Optional[str] = None
    framework_ready: bool = True
    """Also wait until the workers registered with Dask/Ray/Spark where the head can be reached."""
    framework_url: Optional[str] = None
    """The head's dashboard / web UI URL; None: from the environment (docs/readiness.md)."""


@dataclass
class ScaleOutcome(NodeOutcome):
    """What a ``ScaleCluster`` node did."""

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
        outcome = cls(requested=result.requested, effective=result.effective, capped=result.capped, **resized(result, backend))
        if readiness is not None:
            outcome.ready_workers = known(readiness.ready_workers)
            outcome.seconds_waited += readiness.seconds
            outcome.readiness = readiness.proof
        return outcome


def run_scale(
    config: ScaleConfig, cluster: str, replicas: int, worker_hw_tier: Optional[str], head_hw_tier: Optional[str],
    progress: ProgressReporter,
) -> Tuple[ScaleOutcome, WorkerTimeline]:
    """Scale ``cluster`` to ``replicas`` (and tiers) as ``config`` says; the outcome and timeline. A head tier
    change on a backend that cannot do it is :class:`UnsupportedOperationError` before anything changes."""
    ref = parse_cluster(cluster)
    replicas = validate_replicas(replicas)
    worker_hw_tier = validate_tier_name(worker_hw_tier)
    head_hw_tier = validate_tier_name(head_hw_tier, "head_hw_tier")
    config.framework().check(ref.kind)
    timeline = WorkerTimeline()
    deadline = Deadline(config.timeout)
    with open_backend(config.backend) as backend:
        if head_hw_tier is not None and not backend.capabilities.head_tier:
            raise UnsupportedOperationError(
                f"backend {backend.name!r} cannot change the head tier; use the kubernetes backend "
                "or drop head_hw_tier",
                cluster=str(ref),
            )
        if config.wait:
            begin_wait(progress, replicas, config.timeout)
        result = backend.scale(
            ref, replicas, worker_hw_tier, wait=config.wait, timeout=config.timeout, strict=config.strict,
            progress=recording(timeline, worker_hw_tier, progress),
        )
        # The "before" sample from the result: a cluster may not exist before its first scale (local backend).
        timeline.add(observed_workers(result.previous), result.previous.worker_hw_tier, seconds=0.0)
        if head_hw_tier is not None and result.final.head_hw_tier != head_hw_tier:
            backend.restart_head(
                ref, head_hw_tier, wait=config.wait, timeout=max(deadline.remaining, 1.0), progress=progress
            )
        readiness: Optional[Readiness] = None
        if config.wait:
            # Not sampled into the timeline: it plots worker pods, the framework count is the outcome's.
            readiness = ReadinessCheck(backend, ref, config.framework(), progress).change(result, deadline.remaining)
        timeline.add(ready_count(result.final, readiness), worker_hw_tier or result.final.worker_hw_tier)
        timeline.finish()
        return ScaleOutcome.from_result(result, backend.name, readiness), timeline


def scale_line(step: str, outcome: Any, seconds_total: Optional[float] = None) -> str:
    """The summary of a ``ScaleCluster`` node (fields of ``ScaleOutcome``); ``seconds_total`` is the node's own
    time, when the caller measured it. The counts are what the wait found (with an autoscaler above the size
    set, the workers Ready and the size the cluster wants)."""
    change = f"{outcome.cluster} {outcome.previous_workers} -> "
    capped = f", capped from {outcome.requested}" if outcome.capped else ""
    if not outcome.waited:
        return f"{step}: {change}{workers(outcome.effective)}{tier_note(outcome)} requested, not waited for{capped}"
    came = arrived(outcome, found(outcome, outcome.effective), outcome.previous_workers)
    return (
        f"{step}: {change}{came}{above(outcome, outcome.effective)}{tier_note(outcome)} "
        f"{took(outcome.seconds_waited, seconds_total)}{capped}{framework_note(outcome)}"
    )


def create_scale(creation: Creation, config: ScaleConfig, inputs: Dict[str, Any]) -> Sent:
    """Send the scale (safe to repeat); the polls wait for its workers unless ``wait`` is off."""
    backend_name, ref = creation.served(config.backend, inputs["cluster"])
    config.framework().check(ref.kind)
    replicas = validate_replicas(inputs["replicas"])
    tier = validate_tier_name(inputs["worker_hw_tier"])
    head_tier = validate_tier_name(inputs["head_hw_tier"], "head_hw_tier")
    if head_tier is not None:
        raise InvalidInputError(
            "head_hw_tier", head_tier, "None",
            reason="the connector does not change a head tier in a scale node; put it in a RestartHead node",
        )
    with creation.opened(backend_name, ref, config.framework_url or "") as backend:
        result = creation.sent(f"the scale of {ref} to {replicas} workers", lambda: backend.scale(
            ref, replicas, tier, wait=False, timeout=min(config.timeout, CREATE_TIMEOUT), strict=config.strict
        ))
        outcome = ScaleOutcome.from_result(result, backend.name)
    return Sent(
        ref, result.effective if config.wait else -1, outcome,
        framework_ready=config.framework_ready, framework_url=config.framework_url or "",
    )


def finish_scale(meta: Any, state: ClusterState, elapsed: float, readiness: Readiness) -> ScaleOutcome:
    """The outcome once the workers are up: what create knew, with the size and readiness seen now."""
    return meta.outcome_of(
        workers=state.desired_workers, ready_workers=known(readiness.ready_workers), waited=True,
        seconds_waited=elapsed, readiness=readiness.proof,
    )


SCALE: NodeKind[ScaleConfig, ScaleOutcome] = NodeKind(
    "ScaleCluster", SCALE_TASK_TYPE, ScaleConfig, ("cluster", "replicas", "worker_hw_tier", "head_hw_tier"),
    ScaleOutcome, "Cluster scaling", scale_line, run_scale, create_scale, finish_scale,
    failed=lambda backend, ref, error, target: backend.in_place_error(ref, error, target, restoring=False),
    change="the scale",
    cached="a cached scale returns the last run's outcome and changes nothing, whatever size the cluster has now",
)
