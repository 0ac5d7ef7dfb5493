"""The ``RestartHead`` node type: replace a cluster's head (on another tier if asked), sent exactly once."""
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ...backends._base import DEFAULT_RESTART_TIMEOUT
from ...errors import ScalingTimeoutError, TransientError, UnconfirmedChangeError, UnsupportedOperationError
from ...models import ClusterState, RestartResult
from ...refs import parse_cluster
from ..._core.progress import ProgressReporter, begin_wait
from ..._core.summary import took
from ..._core.timeline import WorkerTimeline, observed_workers
from ..._core.validation import validate_tier_name
from ..opening import open_backend
from ..readiness import Readiness
from .kinds import AWAIT_HEAD, CREATE_TIMEOUT, Creation, NodeConfig, NodeKind, NodeOutcome, Sent, restart_json
from .names import RESTART_TASK_TYPE


@dataclass(frozen=True)
class RestartConfig(NodeConfig):
    """Defaults and behaviour of a ``RestartHead`` task."""

    head_hw_tier: Optional[str] = None
    wait: bool = True
    timeout: float = DEFAULT_RESTART_TIMEOUT
    backend: Optional[str] = None


@dataclass
class RestartOutcome(NodeOutcome):
    """What a ``RestartHead`` node did."""

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


def run_restart(
    config: RestartConfig, cluster: str, head_hw_tier: Optional[str], progress: ProgressReporter
) -> Tuple[RestartOutcome, WorkerTimeline]:
    """Replace the head of ``cluster`` (on ``head_hw_tier`` if given); return outcome and timeline."""
    ref = parse_cluster(cluster)
    head_hw_tier = validate_tier_name(head_hw_tier, "head_hw_tier")
    timeline = WorkerTimeline()
    with open_backend(config.backend) as backend:
        before = backend.get_state(ref)
        timeline.add(observed_workers(before), before.worker_hw_tier, seconds=0.0)
        if config.wait:
            begin_wait(progress, 1, config.timeout)
        result = backend.restart_head(ref, head_hw_tier, wait=config.wait, timeout=config.timeout, progress=progress)
        timeline.add(observed_workers(result.final), result.final.worker_hw_tier)
        timeline.finish()
        return RestartOutcome.from_result(result, backend.name), timeline


def restart_line(step: str, outcome: Any, seconds_total: Optional[float] = None) -> str:
    """The summary of a ``RestartHead`` node (fields of ``RestartOutcome``)."""
    tier = f" on {outcome.head_hw_tier}" if outcome.head_hw_tier else ""
    if not outcome.waited:
        return f"{step}: {outcome.cluster} head {outcome.pod} restart requested{tier}, not waited for"
    state = "ready" if outcome.ready else "not seen ready"
    return f"{step}: {outcome.cluster} head {outcome.pod} restarted{tier}, {state} {took(outcome.seconds_waited, seconds_total)}"


def create_restart(creation: Creation, config: RestartConfig, inputs: Dict[str, Any]) -> Sent:
    """Send the restart once. A backend that fails or stalls while it is sent may have restarted the
    head anyway, so that ends the node FAILED (saying so) rather than letting it be sent again."""
    backend_name, ref = creation.served(config.backend, inputs["cluster"])
    head_tier = validate_tier_name(inputs["head_hw_tier"], "head_hw_tier")
    with creation.opened(backend_name, ref) as backend:
        if not backend.capabilities.observes_restarts:
            raise UnsupportedOperationError(
                f"the {backend.name} backend cannot tell a restarted head from the old one after the restart, "
                "so the connector cannot wait for it; run this node in its container",
                cluster=str(ref),
            )
        try:
            result = backend.restart_head(ref, head_tier, wait=False, timeout=min(config.timeout, CREATE_TIMEOUT))
        except (TransientError, ScalingTimeoutError) as error:
            raise UnconfirmedChangeError(
                f"{error.message}; the head restart may have been sent and is not sent again: "
                "check the cluster's head before running this node again",
                cluster=str(ref),
            ) from None
        outcome = RestartOutcome.from_result(result, backend.name)
    return Sent(ref, 1 if config.wait else -1, outcome, awaits=AWAIT_HEAD, restart=restart_json(result))


def finish_restart(meta: Any, state: ClusterState, elapsed: float, readiness: Readiness) -> RestartOutcome:
    """The outcome once the new head is Ready."""
    return meta.outcome_of(ready=True, waited=True, seconds_waited=elapsed)


RESTART: NodeKind[RestartConfig, RestartOutcome] = NodeKind(
    "RestartHead", RESTART_TASK_TYPE, RestartConfig, ("cluster", "head_hw_tier"), RestartOutcome, "Head restart",
    restart_line, run_restart, create_restart, finish_restart, goal="waiting for the new head",
    change="the head restart", repeatable=False,
    cached="a cached restart returns the last run's outcome and restarts nothing",
)
