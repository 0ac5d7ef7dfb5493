"""The ``WaitForCluster`` node type: wait until a cluster's workers are up, changing nothing."""
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

from ...backends._base import DEFAULT_SCALE_TIMEOUT
from ...backends._support.inplace import check_reachable
from ...models import ClusterState
from ...refs import parse_cluster
from ..hold.settings import Check
from ..._core.progress import ProgressReporter, begin_wait
from ..._core.summary import arrived, framework_note, seconds
from ..._core.timeline import WorkerTimeline, observed_workers, recording
from ..._core.validation import replicas_or_minus_one
from ..._core.waiting import Deadline
from ..opening import open_backend
from ..readiness import Readiness, ReadinessCheck
from .kinds import (
    AWAIT_DESIRED, AWAIT_WORKERS, UNKNOWN, ChecksFramework, Creation, NodeConfig, NodeKind, NodeOutcome, Sent, known,
    ready_count,
)
from .names import WAIT_TASK_TYPE


ANY_DESIRED = -1
"""``WaitForCluster`` replicas value meaning "whatever ``spec.worker.replicas`` asks for"."""


validate_wait_replicas = replicas_or_minus_one("the desired count")
"""A worker count to wait for, or ``ANY_DESIRED`` (-1)."""


@dataclass(frozen=True)
class WaitConfig(NodeConfig, ChecksFramework):
    """Defaults and behaviour of a ``WaitForCluster`` task."""

    checks: ClassVar[Mapping[str, Check]] = {**NodeConfig.checks, "replicas": validate_wait_replicas}

    replicas: int = ANY_DESIRED
    timeout: float = DEFAULT_SCALE_TIMEOUT
    backend: Optional[str] = None
    framework_ready: bool = True
    """As for ``ScaleConfig``."""
    framework_url: Optional[str] = None


@dataclass
class ClusterReady(NodeOutcome):
    """What a ``WaitForCluster`` node saw when the workers were up."""

    status: str
    workers: int
    ready_workers: int
    """As in ``ScaleOutcome``: pods Ready, else framework-registered workers, else ``UNKNOWN`` (-1)."""
    seconds_waited: float
    readiness: str = ""
    """Which checks proved readiness (see ``ScaleOutcome``)."""

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
            ready_workers=known(readiness.ready_workers if readiness is not None else state.ready_workers),
            seconds_waited=seconds_waited,
            readiness=readiness.proof if readiness is not None else "",
        )


def run_wait(
    config: WaitConfig, cluster: str, replicas: int, progress: ProgressReporter
) -> Tuple[ClusterReady, WorkerTimeline]:
    """Wait until ``replicas`` workers (``-1``: the desired count) are up on ``cluster``."""
    ref = parse_cluster(cluster)
    replicas = validate_wait_replicas(replicas)
    config.framework().check(ref.kind)
    timeline = WorkerTimeline()
    started = time.monotonic()
    deadline = Deadline(config.timeout)
    with open_backend(config.backend) as backend:
        before = backend.get_state(ref)
        timeline.add(observed_workers(before), before.worker_hw_tier, seconds=0.0)
        # The backend refuses a count that can never come, naming its own limits (e.g. max_workers).
        target = before.desired_workers if replicas == ANY_DESIRED else replicas
        begin_wait(progress, target, config.timeout)
        state = backend.wait_for_workers(
            ref, target, timeout=config.timeout, progress=recording(timeline, before.worker_hw_tier, progress)
        )
        readiness = ReadinessCheck(backend, ref, config.framework(), progress).ready(state, target, deadline.remaining)
        timeline.add(ready_count(state, readiness), state.worker_hw_tier)
        timeline.finish()
        return ClusterReady.from_state(state, backend.name, time.monotonic() - started, readiness), timeline


def wait_line(step: str, outcome: Any, seconds_total: Optional[float] = None) -> str:
    """The summary of a ``WaitForCluster`` node (fields of ``ClusterReady``): the Ready workers where known
    (a wait may end below the size the cluster wants), else the size it wants."""
    after = seconds(max(outcome.seconds_waited, seconds_total or 0.0))
    ready = getattr(outcome, "ready_workers", UNKNOWN)
    count = outcome.workers if ready == UNKNOWN else ready
    wants = f" (the cluster wants {outcome.workers})" if count < outcome.workers else ""
    return f"{step}: {outcome.cluster} {arrived(outcome, count)}{wants} after {after}{framework_note(outcome)}"


def create_wait(creation: Creation, config: WaitConfig, inputs: Dict[str, Any]) -> Sent:
    """Nothing to send: the checks only (the first poll refuses a count that can never come)."""
    backend_name, ref = creation.served(config.backend, inputs["cluster"])
    config.framework().check(ref.kind)
    replicas = validate_wait_replicas(inputs["replicas"])
    with creation.opened(backend_name, ref, config.framework_url or "") as backend:
        name = backend.name
    desired = replicas == ANY_DESIRED
    return Sent(
        ref, 0 if desired else replicas, {"backend": name},
        framework_ready=config.framework_ready, framework_url=config.framework_url or "",
        awaits=AWAIT_DESIRED if desired else AWAIT_WORKERS,
    )


def wait_target(target: int, state: ClusterState) -> int:
    """``target``, the worker count a wait on ``state`` awaits; one that can never come (above the desired
    workers or ``maxReplicas``) is :class:`UnreachableWaitError` at once instead of at the timeout."""
    check_reachable(
        target, desired=state.desired_workers, maximum=state.autoscaling_max, cluster=state.cluster,
        desired_name="desired_workers", state=state,
    )
    return target


def finish_wait(meta: Any, state: ClusterState, elapsed: float, readiness: Readiness) -> ClusterReady:
    """The outcome once the workers are up: the state seen now, on the backend create named."""
    return ClusterReady.from_state(state, str(meta.known_outcome().get("backend", "")), elapsed, readiness)


WAIT: NodeKind[WaitConfig, ClusterReady] = NodeKind(
    "WaitForCluster", WAIT_TASK_TYPE, WaitConfig, ("cluster", "replicas"), ClusterReady, "Cluster wait", wait_line,
    run_wait, create_wait, finish_wait, changes_cluster=False, awaited=wait_target,
    change="the wait's first request",
    cached=(
        "a cached wait returns an old ClusterReady without looking at the cluster, which may have lost its "
        "workers since"
    ),
)
