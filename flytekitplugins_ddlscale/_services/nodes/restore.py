"""The ``RestoreCluster`` node type: put a cluster back to its recorded baseline (or a given size) and forget it."""
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

from ...backends._base import DEFAULT_SCALE_TIMEOUT
from ...errors import InvalidInputError
from ...models import ClusterState, ReplicaSpec, ScaleResult
from ...refs import parse_cluster
from ..hold.settings import Check
from ..._core.progress import ProgressReporter, begin_wait
from ..._core.summary import arrived, tier_note, took, workers
from ..._core.timeline import WorkerTimeline, observed_workers, recording
from ..._core.validation import replicas_or_minus_one, validate_tier_name
from ..._core.waiting import Deadline
from ..opening import open_backend
from ..readiness import Readiness, ReadinessCheck
from .kinds import (
    CREATE_TIMEOUT, MIN_SEND, ChecksFramework, Creation, NodeConfig, NodeKind, NodeOutcome, Sent,
    known, read_within, resized,
)
from .names import RESTORE_TASK_TYPE


FROM_BASELINE = -1
"""``RestoreCluster`` replicas value meaning "the recorded baseline"."""
NOTHING_RECORDED = "nothing recorded"
"""What a restore with no baseline recorded and no size given restored: nothing (the cluster is unchanged)."""


validate_restore_replicas = replicas_or_minus_one("the recorded baseline")
"""What a restore restores: ``FROM_BASELINE`` (-1) or a worker count."""


def validate_restore_target(replicas: object, worker_hw_tier: object) -> Tuple[int, Optional[str]]:
    """A restore target: ``FROM_BASELINE`` (-1) or a worker count, and a tier only with a count."""
    count = validate_restore_replicas(replicas)
    tier = validate_tier_name(worker_hw_tier)
    if tier is not None and count == FROM_BASELINE:
        raise InvalidInputError(
            "worker_hw_tier", tier, "None when restoring the baseline (the baseline brings its own tier); "
            "give replicas to restore an explicit size on a tier"
        )
    return count, tier


@dataclass(frozen=True)
class RestoreConfig(NodeConfig, ChecksFramework):
    """Defaults and behaviour of a ``RestoreCluster`` task."""

    checks: ClassVar[Mapping[str, Check]] = {**NodeConfig.checks, "replicas": validate_restore_replicas}

    replicas: int = FROM_BASELINE
    worker_hw_tier: Optional[str] = None
    wait: bool = True
    timeout: float = DEFAULT_SCALE_TIMEOUT
    backend: Optional[str] = None
    framework_ready: bool = True
    """With ``wait``, also wait until the framework dropped the removed workers where the head can be reached."""
    framework_url: Optional[str] = None
    """As for ``ScaleConfig``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_restore_target(self.replicas, self.worker_hw_tier)


@dataclass
class RestoreOutcome(NodeOutcome):
    """What a ``RestoreCluster`` node did."""

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
        return cls(restored=restored, **resized(result, backend))


def restored_what(target: Optional[ReplicaSpec], baseline: object) -> str:
    """What a restore to ``target`` (None: the baseline) restores, given the ``baseline`` recorded (or None)."""
    return "given size" if target is not None else "baseline" if baseline is not None else NOTHING_RECORDED


def run_restore(
    config: RestoreConfig, cluster: str, replicas: int, worker_hw_tier: Optional[str], progress: ProgressReporter
) -> Tuple[RestoreOutcome, WorkerTimeline]:
    """Put ``cluster`` back to its recorded baseline (``replicas`` -1) or to ``replicas`` workers, and forget
    the baseline, as ``ddlscale restore`` does; with none recorded and no size given nothing changes."""
    ref = parse_cluster(cluster)
    replicas, worker_hw_tier = validate_restore_target(replicas, worker_hw_tier)
    target = None if replicas == FROM_BASELINE else ReplicaSpec(replicas, worker_hw_tier)
    config.framework().check(ref.kind)
    timeline = WorkerTimeline()
    deadline = Deadline(config.timeout)
    with open_backend(config.backend) as backend:
        baseline = backend.get_baseline(ref)
        restored = restored_what(target, baseline)
        goal = target.replicas if target is not None else baseline.replicas if baseline is not None else None
        if config.wait and goal is not None:
            begin_wait(progress, goal, config.timeout)
        result = backend.restore_baseline(
            ref, target, wait=config.wait, timeout=config.timeout,
            progress=recording(timeline, worker_hw_tier, progress),
        )
        timeline.add(observed_workers(result.previous), result.previous.worker_hw_tier, seconds=0.0)
        if config.wait:
            ReadinessCheck(backend, ref, config.framework(), progress).change(result, deadline.remaining)
        timeline.add(observed_workers(result.final), result.final.worker_hw_tier)
        timeline.finish()
        return RestoreOutcome.from_result(result, backend.name, restored), timeline


def restore_line(step: str, outcome: Any, seconds_total: Optional[float] = None) -> str:
    """The summary of a ``RestoreCluster`` node (fields of ``RestoreOutcome``)."""
    if outcome.restored == NOTHING_RECORDED:
        return f"{step}: {outcome.cluster} unchanged at {workers(outcome.workers)} (no baseline recorded)"
    change = f"{outcome.cluster} {outcome.previous_workers} -> "
    if not outcome.waited and outcome.workers > 0:
        return f"{step}: {change}{workers(outcome.workers)}{tier_note(outcome)} ({outcome.restored}) requested, not waited for"
    return (
        f"{step}: {change}{arrived(outcome, outcome.workers, outcome.previous_workers)}{tier_note(outcome)} "
        f"({outcome.restored}) {took(outcome.seconds_waited, seconds_total)}"
    )


def create_restore(creation: Creation, config: RestoreConfig, inputs: Dict[str, Any]) -> Sent:
    """Send the restore (safe to repeat); the polls wait for the restored size unless there is nothing to wait for."""
    backend_name, ref = creation.served(config.backend, inputs["cluster"])
    replicas, tier = validate_restore_target(inputs["replicas"], inputs["worker_hw_tier"])
    target = None if replicas == FROM_BASELINE else ReplicaSpec(replicas, tier)
    with creation.opened(backend_name, ref) as backend:
        bound = Deadline(min(config.timeout, CREATE_TIMEOUT))
        baseline = read_within(bound, f"the baseline read of {ref}", lambda: backend.get_baseline(ref))
        restored = restored_what(target, baseline)
        result: ScaleResult = creation.sent(f"the restore of {ref}", lambda: backend.restore_baseline(
            ref, target, wait=False, timeout=max(bound.remaining, MIN_SEND)
        ))
        outcome = RestoreOutcome.from_result(result, backend.name, restored)
    waits = config.wait and restored != NOTHING_RECORDED and not result.final.workers_up(result.effective)
    return Sent(ref, result.effective if waits else -1, outcome)


def finish_restore(meta: Any, state: ClusterState, elapsed: float, readiness: Readiness) -> RestoreOutcome:
    """The outcome once the restored size is up (and the removed workers gone)."""
    return meta.outcome_of(
        workers=state.desired_workers, ready_workers=known(readiness.ready_workers), waited=True, seconds_waited=elapsed
    )


RESTORE: NodeKind[RestoreConfig, RestoreOutcome] = NodeKind(
    "RestoreCluster", RESTORE_TASK_TYPE, RestoreConfig, ("cluster", "replicas", "worker_hw_tier"), RestoreOutcome,
    "Cluster restore", restore_line, run_restore, create_restore, finish_restore,
    failed=lambda backend, ref, error, target: backend.in_place_error(ref, error, target, restoring=True),
    change="the restore",
    cached="a cached restore returns the last run's outcome and leaves the cluster at the size the flow left it",
)
