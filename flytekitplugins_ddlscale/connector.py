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

What a template may ask for is the deployment's choice, not the template's:
the connector serves only the backends, namespaces and clusters its
environment lists (``scaler`` and ``kubernetes`` by default, never ``local``
unless listed) and reads a template's ``framework_url`` only on a head host
the backend reports for that cluster or the environment allows
(:mod:`.connector_policy`, docs/flyte.md). A failed framework read tells the
caller only that the endpoint is not ready; the detail goes to the debug log.
"""
import json
import logging
import math
import time
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Dict, Optional, Tuple

from flyteidl.core.execution_pb2 import TaskExecution
from flytekit import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.extend.backend.base_connector import AsyncConnectorBase, ConnectorRegistry, Resource, ResourceMeta
from flytekit.models.literals import LiteralMap
from flytekit.models.task import TaskTemplate

from .connector_policy import ConnectorPolicy, reported_head_hosts
from .errors import BackendUnavailableError, InvalidInputError, ScalingError
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
from .refs import ClusterRef, parse_cluster
from .sharing import shared_reads
from .validation import MAX_NODE_TIMEOUT, validate_replicas, validate_tier_name

logger = logging.getLogger("flytekitplugins_ddlscale.connector")

SERVED_TASK_TYPES = (SCALE_TASK_TYPE, WAIT_TASK_TYPE)
POLL_BACKENDS = BackendPool()
"""The backends every ``get`` reads through: kept open across polls, so a thousand executions share one
API client and its connections instead of opening one per poll."""
SHARED_LINGER = 60.0
"""Seconds the shared pod watch of a namespace outlives the last ``get`` that read it (FlytePropeller
polls every few seconds, so a busy namespace keeps one watch instead of a list per poll)."""
SHARED_MAX_AGE = 1.0
"""Age (seconds) of a scaler-service cluster read that may answer another execution's ``get``."""
NOT_READY = "framework endpoint not ready or unreachable"
"""All a caller learns of a failed framework read: refused, 404 and timeout look alike from outside
(details go to the connector's debug log), so a template cannot map what listens where."""


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
    error: str = ""
    """Why the node was refused ('' when it was not): ``get`` reports it as FAILED."""

    @classmethod
    def refused(cls, task_type: str, error: ScalingError) -> "ScalingMetadata":
        """A metadata whose ``get`` fails at once with ``error``'s one-line message."""
        now = time.time()
        return cls(task_type, "", "", -1, now, now, "{}", error=str(error))

    @classmethod
    def decode(cls, data: bytes) -> "ScalingMetadata":
        """The metadata in ``data``; a refused one (saying which field is wrong) when it is malformed,
        so the caller gets a short FAILED answer instead of a traceback."""
        try:
            raw = json.loads(data.decode("utf-8"))
            if not isinstance(raw, dict):
                raise InvalidInputError("resource_meta", type(raw).__name__, "a JSON object")
            values = {f.name: _checked_field(f.name, f.type, raw) for f in fields(cls) if f.name in raw}
            for f in fields(cls):
                if f.name not in values and f.default is MISSING:
                    raise InvalidInputError(f"resource_meta.{f.name}", None, "the value create returned (required)")
            return cls(**values)
        except ScalingError as error:
            return cls.refused(str(raw.get("task_type", "")) if isinstance(raw, dict) else "", error)
        except (ValueError, TypeError):
            return cls.refused("", InvalidInputError("resource_meta", "<not JSON>", "the JSON that create returned"))


_META_TYPES = {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}


def _checked_field(name: str, kind: Any, raw: Dict[str, Any]) -> Any:
    """``raw[name]`` if it has the field's type (whole floats pass as int, ints as float)."""
    value = raw[name]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if not ok or (kind is float and not math.isfinite(value)):
        raise InvalidInputError(f"resource_meta.{name}", type(value).__name__, _META_TYPES.get(kind, str(kind)))
    return value


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
    """Serves one ddlscale task type; register one instance per served type.

    What templates may ask for is fixed when the connector is built, from its
    environment (:class:`~flytekitplugins_ddlscale.connector_policy.ConnectorPolicy`).
    A refused or malformed template or resource metadata ends the node FAILED
    with a one-line message naming the field; nothing is sent for it.
    """

    name = "ddlscale connector"

    def __init__(self, task_type: str, policy: Optional[ConnectorPolicy] = None) -> None:
        if task_type not in SERVED_TASK_TYPES:
            raise ValueError(f"task_type must be one of {SERVED_TASK_TYPES}, not {task_type!r}")
        super().__init__(task_type_name=task_type, metadata_type=ScalingMetadata)
        self.policy = policy if policy is not None else ConnectorPolicy.from_env()

    def create(
        self,
        task_template: TaskTemplate,
        output_prefix: str = "",
        inputs: Optional[LiteralMap] = None,
        task_execution_metadata: Any = None,
        **kwargs: Any,
    ) -> ScalingMetadata:
        """Validate the node's inputs and send the request (without waiting).

        A typed error (bad input, a backend, namespace, cluster or head not
        served, an unknown tier...) comes back as a refused metadata whose
        ``get`` is FAILED with the error's message: flytekit's service would
        turn a raised error into gRPC INTERNAL with a traceback. An unreachable
        backend is raised, so FlytePropeller tries the creation again.
        """
        try:
            values = _python_inputs(task_template, inputs)
            if task_template.type == SCALE_TASK_TYPE:
                return self._create_scale(ScaleConfig.from_custom(task_template.custom), values)
            return self._create_wait(WaitConfig.from_custom(task_template.custom), values)
        except BackendUnavailableError:
            raise
        except ScalingError as error:
            logger.info("refused a %s template: %s", task_template.type, error)
            return ScalingMetadata.refused(task_template.type, error)

    def _served(self, backend_name: Optional[str], cluster: str) -> Tuple[str, ClusterRef]:
        """The served backend name and cluster, or :class:`NotServedError` (nothing opened or sent)."""
        return self.policy.backend(backend_name), parse_cluster(cluster)

    def _check_opened(self, backend: Any, ref: ClusterRef, framework_url: str) -> None:
        """The checks that need the opened backend (its namespace, its head host), before any request."""
        self.policy.check_cluster(ref, backend)
        if framework_url:
            self.policy.check_framework_url(framework_url, reported_head_hosts(backend, ref))

    def _create_scale(self, config: ScaleConfig, values: Dict[str, Any]) -> ScalingMetadata:
        backend_name, ref = self._served(config.backend, values.get("cluster", config.cluster))
        config.framework().check(ref.kind)
        replicas = validate_replicas(values.get("replicas", config.replicas))
        tier = validate_tier_name(values.get("worker_hw_tier", config.worker_hw_tier))
        head_tier = validate_tier_name(values.get("head_hw_tier", config.head_hw_tier), "head_hw_tier")
        if head_tier is not None:
            raise InvalidInputError(
                "head_hw_tier", head_tier, "None",
                reason="a head restart is not served by the connector; run this node in its container",
            )
        with open_backend(backend_name) as backend:
            self._check_opened(backend, ref, config.framework_url or "")
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
        backend_name, ref = self._served(config.backend, values.get("cluster", config.cluster))
        replicas = validate_wait_replicas(values.get("replicas", config.replicas))
        with open_backend(backend_name) as backend:
            self._check_opened(backend, ref, config.framework_url or "")
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
        """RUNNING until the target workers are up; SUCCEEDED with the typed outcome; FAILED at the deadline.

        The metadata comes from the caller, so it is checked as a template is:
        a refused one, a deadline more than :data:`MAX_NODE_TIMEOUT` after the
        start, or a backend, cluster or head not served is FAILED with a
        one-line message. A backend outage is RUNNING until the deadline.
        """
        meta = resource_meta
        if meta.error:
            return Resource(phase=TaskExecution.FAILED, message=meta.error)
        try:
            return self._poll(meta)
        except BackendUnavailableError as error:
            if time.time() >= meta.deadline:
                return Resource(phase=TaskExecution.FAILED, message=f"timed out; the backend is unavailable: {error}")
            return Resource(phase=TaskExecution.RUNNING, message=f"backend unavailable, reading again: {error}")
        except ScalingError as error:
            return Resource(phase=TaskExecution.FAILED, message=str(error))

    def _poll(self, meta: ScalingMetadata) -> Resource:
        if meta.task_type not in SERVED_TASK_TYPES:
            raise InvalidInputError("resource_meta.task_type", meta.task_type, ", ".join(SERVED_TASK_TYPES))
        if not 0 <= meta.deadline - meta.started <= MAX_NODE_TIMEOUT:
            raise InvalidInputError(
                "resource_meta.deadline", meta.deadline, f"at most {MAX_NODE_TIMEOUT:.0f} s after resource_meta.started"
            )
        try:
            known = json.loads(meta.outcome)
            if meta.target < 0:
                return Resource(phase=TaskExecution.SUCCEEDED, outputs={OUTPUT_NAME: ScaleOutcome(**known)})
        except (ValueError, TypeError):
            raise InvalidInputError("resource_meta.outcome", "<unreadable>", "the JSON that create returned") from None
        backend_name, ref = self._served(meta.backend or None, meta.cluster)
        with POLL_BACKENDS.backend(backend_name) as backend, shared_reads(SHARED_LINGER, SHARED_MAX_AGE):
            self._check_opened(backend, ref, meta.framework_url)
            state = backend.get_state(ref)
            if state.workers_up(meta.target):
                removed = meta.task_type == SCALE_TASK_TYPE and int(known.get("previous_workers", 0)) > meta.target
                readiness, pending = self._framework(
                    meta, ref.kind, state, backend_proof(backend, state, ref.kind), removed)
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
    def _framework(
        meta: ScalingMetadata, kind: str, state: Any, base: str, removed: bool = False
    ) -> Tuple[Optional[Readiness], str]:
        """(readiness, '') once proven; (None, what is still awaited) while the framework lags: the
        target's workers registered, or, after a scale-down (``removed``), the removed ones dropped."""
        probe = probe_for(kind)
        if not meta.framework_ready or not enabled_by_env():
            return Readiness(state.ready_workers, f"{base}; framework check off"), ""
        if probe is None or (meta.target <= 0 and not removed):
            return Readiness(state.ready_workers, base), ""
        endpoint = resolve_endpoint(kind, meta.framework_url or None)
        if endpoint is None:
            note = f"framework not checked (the connector does not know the head: set {where_to_set(kind)})"
            return Readiness(state.ready_workers, f"{base}; {note}"), ""
        what = f"{meta.target} workers registered with {probe.registry} at {endpoint.url}"
        try:
            seen = read_registered(probe, endpoint, timeout=5.0)
        except HeadUnreachable as error:
            logger.debug("framework read of %s failed: %s", endpoint.url, error)
            return None, f"{what} ({NOT_READY})"
        if removed and seen > meta.target:
            return None, f"{probe.registry} at {endpoint.url} to drop the removed workers ({seen} registered)"
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
