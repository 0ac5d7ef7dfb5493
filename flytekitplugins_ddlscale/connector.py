"""A Flyte connector for ``ddlscale_scale`` and ``ddlscale_wait`` nodes: scaling without a pod per node.

Where the deployment runs flytekit's connector service with this plugin
installed and routes these task types to it, FlytePropeller calls
:meth:`ScalingConnector.create` once (which sends the scale request without
waiting) and :meth:`ScalingConnector.get` until the workers are up or the
node's timeout passes. Without a connector the same nodes run as ordinary
Python tasks in their container (the default, also for local runs).

Many executions at once: every ``get`` reads inside
:func:`~flytekitplugins_ddlscale.sharing.shared_reads`, so the connector
process answers all its executions' polls from one pod watch per namespace
on Kubernetes (kept :data:`SHARED_LINGER` seconds after the last read),
through backends kept open across polls (:data:`POLL_BACKENDS`), and
from shared, paced cluster polls on the scaler service (a read at most
:data:`SHARED_MAX_AGE` seconds old answers every execution on that
cluster). What a poll waits for stays in the resource metadata, so a
restarted connector goes on where it was.

``RestartHead`` is not served here: the backend protocol cannot tell a new
head from the old one after the fact, so it always runs in its container.

Framework readiness: the connector runs in the Flyte deployment, not in the
Domino run, so the run's ``DASK_SCHEDULER_SERVICE_HOST``/``RAY_HEAD_SERVICE_HOST``
and Spark configuration are not there. It checks only a head it is told
about: the node's ``framework_url`` or ``$DDLSCALE_<KIND>_URL`` /
``$DDLSCALE_FRAMEWORK_URL`` in the connector's environment, with one status
read per ``get``. Otherwise the outcome's ``readiness`` says the framework
was not checked.
"""
import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Tuple

from flyteidl.core.execution_pb2 import TaskExecution
from flytekit import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.extend.backend.base_connector import AsyncConnectorBase, ConnectorRegistry, Resource, ResourceMeta
from flytekit.models.literals import LiteralMap
from flytekit.models.task import TaskTemplate

from .errors import ScalingError
from .framework.confirm import Readiness, backend_proof
from .framework.endpoints import enabled_by_env, resolve_endpoint, where_to_set
from .framework.probes import probe_for
from .framework.wait import HeadUnreachable, read_registered
from .inplace import check_reachable
from .models import ClusterState
from .nodes.config import ANY_DESIRED, ScaleConfig, WaitConfig, validate_wait_replicas
from .nodes.names import OUTPUT_NAME, SCALE_TASK_TYPE, WAIT_TASK_TYPE
from .nodes.outputs import ClusterReady, ScaleOutcome
from .opening import BackendPool, open_backend
from .refs import parse_cluster
from .sharing import shared_reads
from .validation import validate_replicas, validate_tier_name

SERVED_TASK_TYPES = (SCALE_TASK_TYPE, WAIT_TASK_TYPE)
POLL_BACKENDS = BackendPool()
"""The backends every ``get`` reads through: kept open across polls, so a thousand executions share one
API client and its connections instead of opening one per poll."""
SHARED_LINGER = 60.0
"""Seconds the shared pod watch of a namespace outlives the last ``get`` that read it (FlytePropeller
polls every few seconds, so a busy namespace keeps one watch instead of a list per poll)."""
SHARED_MAX_AGE = 1.0
"""Age (seconds) of a scaler-service cluster read that may answer another execution's ``get``."""


@dataclass
class ScalingMetadata(ResourceMeta):
    """What ``create`` hands to ``get``: enough to check completion without any other state."""

    task_type: str
    cluster: str
    backend: str
    target: int
    """Workers to wait for; -1 means no wait was asked for."""
    started: float
    """Epoch seconds when the request was sent."""
    deadline: float
    """Epoch seconds after which ``get`` reports failure."""
    outcome: str
    """JSON of the outcome known at creation (completed by ``get``)."""
    framework_ready: bool = True
    framework_url: str = ""
    """The node's ``framework_url`` ('' for none)."""


def wait_target(state: ClusterState, replicas: int) -> int:
    """The worker count a wait on ``state`` should await (``-1``: the desired count).

    A count that can never come (above the desired workers or above
    ``maxReplicas``) raises :class:`UnreachableWaitError` at once instead of
    waiting out the timeout.
    """
    if replicas == ANY_DESIRED:
        return state.desired_workers
    check_reachable(
        replicas, desired=state.desired_workers, maximum=state.autoscaling_max, cluster=state.cluster,
        desired_name="desired_workers", state=state,
    )
    return replicas


def _python_inputs(task_template: TaskTemplate, inputs: Optional[LiteralMap]) -> Dict[str, Any]:
    if inputs is None:
        return {}
    ctx = FlyteContextManager.current_context()
    types = {name: TypeEngine.guess_python_type(var.type) for name, var in task_template.interface.inputs.items()}
    return TypeEngine.literal_map_to_kwargs(ctx, inputs, types)


class ScalingConnector(AsyncConnectorBase):
    """Serves one ddlscale task type; register one instance per served type."""

    name = "ddlscale connector"

    def __init__(self, task_type: str) -> None:
        if task_type not in SERVED_TASK_TYPES:
            raise ValueError(f"task_type must be one of {SERVED_TASK_TYPES}, not {task_type!r}")
        super().__init__(task_type_name=task_type, metadata_type=ScalingMetadata)

    def create(
        self,
        task_template: TaskTemplate,
        output_prefix: str = "",
        inputs: Optional[LiteralMap] = None,
        task_execution_metadata: Any = None,
        **kwargs: Any,
    ) -> ScalingMetadata:
        """Validate the node's inputs and send the request (without waiting)."""
        values = _python_inputs(task_template, inputs)
        if task_template.type == SCALE_TASK_TYPE:
            return self._create_scale(ScaleConfig.from_custom(task_template.custom), values)
        return self._create_wait(WaitConfig.from_custom(task_template.custom), values)

    def _create_scale(self, config: ScaleConfig, values: Dict[str, Any]) -> ScalingMetadata:
        ref = parse_cluster(values.get("cluster", config.cluster))
        config.framework().check(ref.kind)
        replicas = validate_replicas(values.get("replicas", config.replicas))
        tier = validate_tier_name(values.get("worker_hw_tier", config.worker_hw_tier))
        if validate_tier_name(values.get("head_hw_tier", config.head_hw_tier), "head_hw_tier") is not None:
            raise ScalingError(
                "head_hw_tier needs a head restart, which the connector does not serve; "
                "run this node in its container (without the connector)",
                code="unsupported",
                cluster=str(ref),
            )
        with open_backend(config.backend) as backend:
            result = backend.scale(ref, replicas, tier, wait=False, timeout=config.timeout, strict=config.strict)
            outcome = ScaleOutcome.from_result(result, backend.name)
        now = time.time()
        return ScalingMetadata(
            task_type=SCALE_TASK_TYPE,
            cluster=str(ref),
            backend=config.backend or "",
            target=result.effective if config.wait else -1,
            started=now,
            deadline=now + config.timeout,
            outcome=json.dumps(asdict(outcome)),
            framework_ready=config.framework_ready,
            framework_url=config.framework_url or "",
        )

    def _create_wait(self, config: WaitConfig, values: Dict[str, Any]) -> ScalingMetadata:
        ref = parse_cluster(values.get("cluster", config.cluster))
        replicas = validate_wait_replicas(values.get("replicas", config.replicas))
        with open_backend(config.backend) as backend:
            state = backend.get_state(ref)
            target = wait_target(state, replicas)
            outcome = ClusterReady.from_state(state, backend.name, 0.0)
        now = time.time()
        return ScalingMetadata(
            task_type=WAIT_TASK_TYPE,
            cluster=str(ref),
            backend=config.backend or "",
            target=target,
            started=now,
            deadline=now + config.timeout,
            outcome=json.dumps(asdict(outcome)),
            framework_ready=config.framework_ready,
            framework_url=config.framework_url or "",
        )

    def get(self, resource_meta: ScalingMetadata, **kwargs: Any) -> Resource:
        """RUNNING until the target workers are up; SUCCEEDED with the typed outcome; FAILED at the deadline."""
        meta = resource_meta
        known = json.loads(meta.outcome)
        if meta.target < 0:
            return Resource(phase=TaskExecution.SUCCEEDED, outputs={OUTPUT_NAME: ScaleOutcome(**known)})
        ref = parse_cluster(meta.cluster)
        with POLL_BACKENDS.backend(meta.backend or None) as backend, shared_reads(SHARED_LINGER, SHARED_MAX_AGE):
            state = backend.get_state(ref)
            if state.workers_up(meta.target):
                readiness, pending = self._framework(meta, ref.kind, state, backend_proof(backend, state, ref.kind))
            else:
                readiness, pending = None, f"{meta.target} workers"
        elapsed = time.time() - meta.started
        if readiness is not None:
            return Resource(
                phase=TaskExecution.SUCCEEDED,
                outputs={OUTPUT_NAME: self._finished(meta, known, state, elapsed, readiness)},
            )
        if time.time() >= meta.deadline:
            return Resource(
                phase=TaskExecution.FAILED,
                message=f"timed out after {elapsed:.0f}s waiting for {pending}; last state: {state.describe()}",
            )
        return Resource(phase=TaskExecution.RUNNING, message=f"waiting for {pending}: {state.describe()}")

    @staticmethod
    def _framework(meta: ScalingMetadata, kind: str, state: Any, base: str) -> Tuple[Optional[Readiness], str]:
        """(readiness, '') once proven; (None, what is still awaited) while the framework lags."""
        probe = probe_for(kind)
        if not meta.framework_ready or not enabled_by_env():
            return Readiness(state.ready_workers, f"{base}; framework check off"), ""
        if probe is None or meta.target <= 0:
            return Readiness(state.ready_workers, base), ""
        endpoint = resolve_endpoint(kind, meta.framework_url or None)
        if endpoint is None:
            note = f"framework not checked (the connector does not know the head: set {where_to_set(kind)})"
            return Readiness(state.ready_workers, f"{base}; {note}"), ""
        what = f"{meta.target} workers registered with {probe.registry} at {endpoint.url}"
        try:
            seen = read_registered(probe, endpoint, timeout=5.0)
        except HeadUnreachable as error:
            return None, f"{what} (head unreachable: {error})"
        if seen < meta.target:
            return None, f"{what} ({seen} registered)"
        ready = seen if state.ready_workers is None else min(seen, state.ready_workers)
        return Readiness(ready, f"{base}; {seen} workers registered with {probe.registry} at {endpoint.url}"), ""

    @staticmethod
    def _finished(meta: ScalingMetadata, known: Dict[str, Any], state: Any, elapsed: float, readiness: Readiness) -> Any:
        if meta.task_type == WAIT_TASK_TYPE:
            return ClusterReady.from_state(state, known["backend"], elapsed, readiness)
        known.update(
            workers=state.desired_workers,
            ready_workers=-1 if readiness.ready_workers is None else readiness.ready_workers,
            waited=True,
            seconds_waited=elapsed,
            readiness=readiness.proof,
        )
        return ScaleOutcome(**known)

    def delete(self, resource_meta: ScalingMetadata, **kwargs: Any) -> None:
        """Aborting a node stops the wait only: the cluster keeps the size it was asked for.

        Pair pipelines with :func:`~flytekitplugins_ddlscale.workflow_helpers.scale_down_on_failure`
        to shrink after a failure or abort.
        """


def register_connectors() -> None:
    """Register a connector for every served task type (idempotent)."""
    for task_type in SERVED_TASK_TYPES:
        ConnectorRegistry.register(ScalingConnector(task_type), override=True)


register_connectors()
