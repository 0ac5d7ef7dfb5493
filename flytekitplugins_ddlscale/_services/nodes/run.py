"""What the scaling nodes do when they run in a task: a flytekit task (:mod:`..tasks`) or a Flyte 2 task (:mod:`..flyte2`).

Each function validates its inputs, picks the backend, performs the
operation with progress going to ``progress`` (and into a
:class:`~flytekitplugins_ddlscale._core.timeline.WorkerTimeline`), and returns the
typed outcome together with the timeline for a Deck.
"""
import time
from typing import Optional, Tuple

from ...errors import UnsupportedOperationError
from ..readiness import Readiness, confirm_change, confirm_ready
from ...models import ClusterState, ReplicaSpec
from .config import (
    ANY_DESIRED,
    FROM_BASELINE,
    RestartConfig,
    RestoreConfig,
    ScaleConfig,
    WaitConfig,
    validate_restore_target,
    validate_wait_replicas,
)
from .outputs import ClusterReady, RestartOutcome, RestoreOutcome, ScaleOutcome
from ..opening import open_backend
from ..._core.progress import ProgressReporter, begin_wait, default_reporter
from ...refs import parse_cluster
from ..._core.timeline import WorkerTimeline, observed_workers, recording
from ..._core.validation import validate_replicas, validate_tier_name
from ..._core.waiting import Deadline


def run_scale(
    config: ScaleConfig,
    cluster: str,
    replicas: int,
    worker_hw_tier: Optional[str],
    head_hw_tier: Optional[str],
    progress: Optional[ProgressReporter] = None,
) -> Tuple[ScaleOutcome, WorkerTimeline]:
    """Scale ``cluster`` to ``replicas`` (and tiers) as ``config`` says; return outcome and timeline.

    A head tier change needs a backend that can do it; otherwise
    :class:`UnsupportedOperationError` is raised before anything changes.
    """
    ref = parse_cluster(cluster)
    replicas = validate_replicas(replicas)
    worker_hw_tier = validate_tier_name(worker_hw_tier)
    head_hw_tier = validate_tier_name(head_hw_tier, "head_hw_tier")
    config.framework().check(ref.kind)
    reporter = progress if progress is not None else default_reporter()
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
            begin_wait(reporter, replicas, config.timeout)
        result = backend.scale(
            ref,
            replicas,
            worker_hw_tier,
            wait=config.wait,
            timeout=config.timeout,
            strict=config.strict,
            progress=recording(timeline, worker_hw_tier, reporter),
        )
        # A cluster may not exist before its first scale (local backend), so the
        # "before" sample comes from the result rather than a separate read.
        timeline.add(observed_workers(result.previous), result.previous.worker_hw_tier, seconds=0.0)
        if head_hw_tier is not None and result.final.head_hw_tier != head_hw_tier:
            backend.restart_head(
                ref, head_hw_tier, wait=config.wait, timeout=max(deadline.remaining, 1.0), progress=reporter
            )
        readiness: Optional[Readiness] = None
        if config.wait:
            # Not sampled into the timeline: it plots worker pods, the framework count is the outcome's.
            readiness = confirm_change(backend, ref, result, deadline.remaining, config.framework(), reporter)
        timeline.add(_ready_count(result.final, readiness), worker_hw_tier or result.final.worker_hw_tier)
        timeline.finish()
        return ScaleOutcome.from_result(result, backend.name, readiness), timeline


def run_restart(
    config: RestartConfig,
    cluster: str,
    head_hw_tier: Optional[str],
    progress: Optional[ProgressReporter] = None,
) -> Tuple[RestartOutcome, WorkerTimeline]:
    """Replace the head of ``cluster`` (on ``head_hw_tier`` if given); return outcome and timeline."""
    ref = parse_cluster(cluster)
    head_hw_tier = validate_tier_name(head_hw_tier, "head_hw_tier")
    reporter = progress if progress is not None else default_reporter()
    timeline = WorkerTimeline()
    with open_backend(config.backend) as backend:
        before = backend.get_state(ref)
        timeline.add(observed_workers(before), before.worker_hw_tier, seconds=0.0)
        if config.wait:
            begin_wait(reporter, 1, config.timeout)
        result = backend.restart_head(
            ref, head_hw_tier, wait=config.wait, timeout=config.timeout, progress=reporter
        )
        timeline.add(observed_workers(result.final), result.final.worker_hw_tier)
        timeline.finish()
        return RestartOutcome.from_result(result, backend.name), timeline


def run_wait(
    config: WaitConfig,
    cluster: str,
    replicas: int,
    progress: Optional[ProgressReporter] = None,
) -> Tuple[ClusterReady, WorkerTimeline]:
    """Wait until ``replicas`` workers (``-1``: the desired count) are up on ``cluster``."""
    ref = parse_cluster(cluster)
    replicas = validate_wait_replicas(replicas)
    config.framework().check(ref.kind)
    reporter = progress if progress is not None else default_reporter()
    timeline = WorkerTimeline()
    started = time.monotonic()
    deadline = Deadline(config.timeout)
    with open_backend(config.backend) as backend:
        before = backend.get_state(ref)
        timeline.add(observed_workers(before), before.worker_hw_tier, seconds=0.0)
        # The backend refuses a count that can never come, naming its own limits (e.g. max_workers).
        target = before.desired_workers if replicas == ANY_DESIRED else replicas
        begin_wait(reporter, target, config.timeout)
        state = backend.wait_for_workers(
            ref, target, timeout=config.timeout, progress=recording(timeline, before.worker_hw_tier, reporter)
        )
        readiness = confirm_ready(backend, ref, state, target, deadline.remaining, config.framework(), reporter)
        timeline.add(_ready_count(state, readiness), state.worker_hw_tier)
        timeline.finish()
        return ClusterReady.from_state(state, backend.name, time.monotonic() - started, readiness), timeline


def _ready_count(state: ClusterState, readiness: Optional[Readiness]) -> int:
    if readiness is not None and readiness.ready_workers is not None:
        return readiness.ready_workers
    return observed_workers(state)


def run_restore(
    config: RestoreConfig,
    cluster: str,
    replicas: int,
    worker_hw_tier: Optional[str],
    progress: Optional[ProgressReporter] = None,
) -> Tuple[RestoreOutcome, WorkerTimeline]:
    """Put ``cluster`` back to its recorded baseline (``replicas`` -1) or to ``replicas`` workers.

    Either way the baseline is forgotten afterwards, as ``ddlscale restore``
    does. With no baseline recorded and no size given nothing changes
    (``restored`` is ``nothing recorded``).
    """
    ref = parse_cluster(cluster)
    replicas, worker_hw_tier = validate_restore_target(replicas, worker_hw_tier)
    target = None if replicas == FROM_BASELINE else ReplicaSpec(replicas, worker_hw_tier)
    config.framework().check(ref.kind)
    reporter = progress if progress is not None else default_reporter()
    timeline = WorkerTimeline()
    deadline = Deadline(config.timeout)
    with open_backend(config.backend) as backend:
        baseline = backend.get_baseline(ref)
        restored = "given size" if target is not None else "baseline" if baseline is not None else "nothing recorded"
        goal = target.replicas if target is not None else baseline.replicas if baseline is not None else None
        if config.wait and goal is not None:
            begin_wait(reporter, goal, config.timeout)
        result = backend.restore_baseline(
            ref,
            target,
            wait=config.wait,
            timeout=config.timeout,
            progress=recording(timeline, worker_hw_tier, reporter),
        )
        timeline.add(observed_workers(result.previous), result.previous.worker_hw_tier, seconds=0.0)
        if config.wait:
            confirm_change(backend, ref, result, deadline.remaining, config.framework(), reporter)
        timeline.add(observed_workers(result.final), result.final.worker_hw_tier)
        timeline.finish()
        return RestoreOutcome.from_result(result, backend.name, restored), timeline
