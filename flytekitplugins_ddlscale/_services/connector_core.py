"""What every connector for the scaling nodes does, whichever Flyte serves it: check, send, poll.

Two surfaces serve the ``ddlscale_*`` task types: flytekit's connector
(:mod:`.connector`, for FlytePropeller) and Flyte 2's
(:mod:`.flyte2.connector`). Both hand :class:`ScalingService` the node's
task type, its configuration (the template's ``custom``) and its input
values, and get back the resource metadata (:mod:`.connector_meta`); both
hand it that metadata on every poll and get back a :class:`Poll` (running,
succeeded with the node's typed outcome, or failed with a one-line
message), which each turns into its own protocol's answer.

``create`` checks the node and sends its change without waiting:
``ScaleCluster`` the scale, ``RestoreCluster`` the restore, ``RestartHead``
the head restart, ``WaitForCluster`` nothing. It gives the backend at most
:data:`CREATE_TIMEOUT` seconds to accept the change. Each ``poll`` reads the
cluster once and decides; it never sends a change, so a head restart is sent
exactly once however often it is called. What a poll waits for stays in the
metadata, so a restarted connector goes on where it was. Polls read inside
:func:`~flytekitplugins_ddlscale._core.sharing.shared_reads` through backends kept
open across polls (:data:`POLL_BACKENDS`), so one connector process answers
many executions from shared reads.

What a template may ask for is the deployment's choice
(:class:`~flytekitplugins_ddlscale._services.connector_policy.ConnectorPolicy`): the
backends, namespaces and clusters the connector's environment lists
(``scaler`` and ``kubernetes`` by default, never ``local`` unless listed) and
a ``framework_url`` only on a head host the backend reports or the
environment allows. A failed framework read tells the caller only that the
endpoint is not ready; the detail goes to the debug log.
"""
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type, TypeVar

from .connector_meta import AWAIT_DESIRED, AWAIT_HEAD, AWAIT_WORKERS, ScalingMetadata, restart_json
from .connector_policy import ConnectorPolicy, reported_head_hosts
from ..errors import (
    BackendUnavailableError,
    InvalidInputError,
    NeverReachedError,
    ScalingError,
    ScalingTimeoutError,
    TransientError,
    UnconfirmedChangeError,
    UnsupportedOperationError,
)
from .readiness import Readiness, backend_proof
from .._framework.endpoints import enabled_by_env, framework_of, kind_url_env, resolve_endpoint
from .._framework.probes import probe_for
from .._framework.wait import HeadUnreachable, read_registered
from ..backends._support.inplace import check_reachable
from ..models import ClusterState, ReplicaSpec, ScaleResult
from .nodes.config import (
    ANY_DESIRED,
    FROM_BASELINE,
    RestartConfig,
    RestoreConfig,
    ScaleConfig,
    WaitConfig,
    validate_restore_target,
    validate_wait_replicas,
)
from .nodes.kinds import NODE_KINDS, RESTART, RESTORE, SCALE, WAIT
from .nodes.names import RESTART_TASK_TYPE, RESTORE_TASK_TYPE, SCALE_TASK_TYPE, WAIT_TASK_TYPE
from .nodes.outputs import UNKNOWN, ClusterReady, RestartOutcome, RestoreOutcome, ScaleOutcome
from .opening import BackendPool, open_backend
from ..refs import ClusterRef, parse_cluster
from .._core import settings
from .._core.sharing import shared_reads
from .._core.validation import MAX_NODE_TIMEOUT, validate_replicas, validate_tier_name
from .._core.waiting import Deadline

logger = logging.getLogger("flytekitplugins_ddlscale.connector")

SERVED_TASK_TYPES = tuple(NODE_KINDS)
CREATE_TIMEOUT = 5.0
"""Seconds ``create`` gives the backend to accept a change (the reads before it, its requests, retries and
locks together).

FlytePropeller gives ``CreateTask`` 10 s by default; the rest is left for
opening the backend and the gRPC round trip. A backend slower than this
makes ``create`` raise (a retryable failure of the node), except for a head
restart, which may have been sent and so ends FAILED instead of being sent again."""
POLL_BACKENDS = BackendPool()
"""The backends every ``get`` reads through: kept open across polls, so a thousand executions share one
API client and its connections instead of opening one per poll."""
SHARED_LINGER = 60.0
"""Seconds the shared pod watch of a namespace outlives the last ``get`` that read it: executions in the
same namespace poll within a resync interval of each other, so a busy namespace keeps one watch."""
SHARED_MAX_AGE = 1.0
"""Age (seconds) of a scaler-service cluster read that may answer another execution's ``get``."""
NOT_READY = "framework endpoint not ready or unreachable"
"""All a caller learns of a failed framework read: refused, 404 and timeout look alike from outside
(details go to the connector's debug log), so a template cannot map what listens where."""
NOTHING_RECORDED = "nothing recorded"
MIN_SEND = 1.0
"""Seconds a change gets when a read before it used up (nearly) all of the create bound."""
RUNNING, SUCCEEDED, FAILED = "RUNNING", "SUCCEEDED", "FAILED"
"""A poll's answers (named like Flyte's task execution phases, which each connector maps them to)."""
UNAVAILABLE_HERE = (TransientError, NeverReachedError)
"""What the connector treats as the backend being unavailable for now: a create raises it (Flyte
sends the create again; what a create sends is safe to repeat, a restart that may have gone out is
:class:`UnconfirmedChangeError` instead) and a poll reads again until the node's deadline. A backend
the connector has not reached since it started counts: the connector is a service whose nodes'
backends answered before (their creates reached them), so more likely restarting than misaddressed."""

T = TypeVar("T")
C = TypeVar("C")


@dataclass(frozen=True)
class Poll:
    """One poll's answer: ``state`` is :data:`RUNNING`, :data:`SUCCEEDED` (with ``outcome``, the node's
    typed output) or :data:`FAILED` (``message`` says why in one line)."""

    state: str
    message: str = ""
    outcome: Any = None


def node_config(config_type: Type[C], custom: Any) -> C:
    """The node's configuration from a template's ``custom``, checked (each field's own check names it)."""
    try:
        return config_type.from_custom(custom)  # type: ignore[attr-defined]
    except ScalingError:
        raise
    except (TypeError, ValueError, AttributeError) as error:
        # A field the configuration class does not check itself (e.g. an unhashable value).
        raise InvalidInputError("custom", type(error).__name__, "the configuration the node was serialized with") from None


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


def read_within(deadline: Deadline, what: str, read: Callable[[], T]) -> T:
    """``read()``, or :class:`BackendUnavailableError` once ``deadline`` passes first.

    For reads the protocol gives no deadline (``get_baseline``): the read goes
    on in a daemon thread and its answer is dropped, which is safe for a read
    and for nothing else.
    """
    answer: Dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            answer["value"] = read()
        except BaseException as error:  # handed to the caller below
            answer["error"] = error
        finally:
            done.set()

    threading.Thread(target=run, name="ddlscale-connector-read", daemon=True).start()
    if not done.wait(deadline.remaining):
        raise BackendUnavailableError(
            f"the backend did not answer {what} within {deadline.timeout:g} s (the connector's create bound)"
        )
    if "error" in answer:
        raise answer["error"]
    return answer["value"]


def head_env(backend: Any, ref: ClusterRef, environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Where a node would find ``ref``'s head: the connector's own ``DDLSCALE_*`` settings (URL
    overrides, dashboard ports), then the variables the backend reports for the cluster (what Domino
    injects into a run). The connector's other variables are not the cluster's and are left out."""
    env = settings.ddlscale_variables(environ)
    try:
        env.update(backend.connection_env(ref))
    except ScalingError as error:
        logger.debug("no head address for %s: %s", ref, error)
    return env


class ScalingService:
    """Create and poll for the four scaling nodes, under the policy fixed when it is built.

    A refused or malformed template or metadata ends the node FAILED with a
    one-line message naming the field; nothing is sent for it.
    """

    def __init__(self, policy: Optional[ConnectorPolicy] = None) -> None:
        self.policy = policy if policy is not None else ConnectorPolicy.from_env()
        self._creators: Dict[str, Callable[[Any, Dict[str, Any]], ScalingMetadata]] = {
            SCALE.task_type: self._create_scale,
            WAIT.task_type: self._create_wait,
            RESTORE.task_type: self._create_restore,
            RESTART.task_type: self._create_restart,
        }

    def create(self, task_type: str, custom: Any, values: Mapping[str, Any]) -> ScalingMetadata:
        """Check the node, send its change (without waiting) and return what :meth:`poll` needs.

        ``custom`` is the template's configuration (a dictionary; anything else is refused naming
        ``custom``), ``values`` its input
        values (Python values). A typed error (bad input, a backend,
        namespace, cluster or head not served, an unknown tier...) comes back
        as a refused metadata whose poll is FAILED with the error's message.
        A backend that is unreachable or does not accept a scale, wait or
        restore within :data:`CREATE_TIMEOUT` is raised as
        :class:`BackendUnavailableError` (safe to repeat: the caller's retry
        runs it again).
        """
        try:
            kind = NODE_KINDS.get(task_type)
            if kind is None:
                raise InvalidInputError("task_type", task_type, ", ".join(SERVED_TASK_TYPES))
            config = node_config(kind.config, custom)
            return self._creators[task_type](config, kind.given(config, values))
        except UNAVAILABLE_HERE:
            raise
        except ScalingError as error:
            logger.info("refused a %s template: %s", task_type, error)
            return ScalingMetadata.refused(task_type, error)

    def _served(self, backend_name: Optional[str], cluster: object) -> Tuple[str, ClusterRef]:
        """The served backend name and cluster, or :class:`NotServedError` (nothing opened or sent)."""
        return self.policy.backend(backend_name), parse_cluster(cluster)  # type: ignore[arg-type]

    def _check_opened(self, backend: Any, ref: ClusterRef, framework_url: str) -> None:
        """The checks that need the opened backend (its namespace, its head host), before any request."""
        self.policy.check_cluster(ref, backend)
        if framework_url:
            self.policy.check_framework_url(framework_url, reported_head_hosts(backend, ref))

    @staticmethod
    def _sent(what: str, send: Callable[[], Any]) -> Any:
        """``send()``; a backend that does not accept it within the create bound is
        :class:`BackendUnavailableError` (raised, so the node is retried: these changes are safe to repeat)."""
        try:
            return send()
        except ScalingTimeoutError as error:
            raise BackendUnavailableError(
                f"the backend did not accept {what} within {CREATE_TIMEOUT:g} s (the connector's create bound): "
                f"{error.message}",
                cluster=error.cluster,
            ) from None

    @staticmethod
    def _metadata(task_type: str, ref: ClusterRef, backend: Optional[str], timeout: float, target: int,
                  outcome: Any, **extra: Any) -> ScalingMetadata:
        now = time.time()
        return ScalingMetadata(
            task_type=task_type, cluster=str(ref), backend=backend or "", target=target, started=now,
            deadline=now + timeout, outcome=json.dumps(outcome if isinstance(outcome, dict) else asdict(outcome)),
            **extra,
        )

    def _create_scale(self, config: ScaleConfig, inputs: Dict[str, Any]) -> ScalingMetadata:
        backend_name, ref = self._served(config.backend, inputs["cluster"])
        config.framework().check(ref.kind)
        replicas = validate_replicas(inputs["replicas"])
        tier = validate_tier_name(inputs["worker_hw_tier"])
        head_tier = validate_tier_name(inputs["head_hw_tier"], "head_hw_tier")
        if head_tier is not None:
            raise InvalidInputError(
                "head_hw_tier", head_tier, "None",
                reason="the connector does not change a head tier in a scale node; put it in a RestartHead node",
            )
        with open_backend(backend_name) as backend:
            self._check_opened(backend, ref, config.framework_url or "")
            result = self._sent(f"the scale of {ref} to {replicas} workers", lambda: backend.scale(
                ref, replicas, tier, wait=False, timeout=min(config.timeout, CREATE_TIMEOUT), strict=config.strict
            ))
            outcome = ScaleOutcome.from_result(result, backend.name)
        return self._metadata(
            SCALE_TASK_TYPE, ref, config.backend, config.timeout, result.effective if config.wait else -1, outcome,
            framework_ready=config.framework_ready, framework_url=config.framework_url or "",
        )

    def _create_wait(self, config: WaitConfig, inputs: Dict[str, Any]) -> ScalingMetadata:
        """Nothing to send: the checks only (the first ``get`` reads the cluster and refuses a count
        that can never come)."""
        backend_name, ref = self._served(config.backend, inputs["cluster"])
        config.framework().check(ref.kind)
        replicas = validate_wait_replicas(inputs["replicas"])
        with open_backend(backend_name) as backend:
            self._check_opened(backend, ref, config.framework_url or "")
            name = backend.name
        desired = replicas == ANY_DESIRED
        return self._metadata(
            WAIT_TASK_TYPE, ref, config.backend, config.timeout, 0 if desired else replicas, {"backend": name},
            framework_ready=config.framework_ready, framework_url=config.framework_url or "",
            awaits=AWAIT_DESIRED if desired else AWAIT_WORKERS,
        )

    def _create_restore(self, config: RestoreConfig, inputs: Dict[str, Any]) -> ScalingMetadata:
        backend_name, ref = self._served(config.backend, inputs["cluster"])
        replicas, tier = validate_restore_target(inputs["replicas"], inputs["worker_hw_tier"])
        target = None if replicas == FROM_BASELINE else ReplicaSpec(replicas, tier)
        with open_backend(backend_name) as backend:
            self._check_opened(backend, ref, "")
            bound = Deadline(min(config.timeout, CREATE_TIMEOUT))
            baseline = read_within(bound, f"the baseline read of {ref}", lambda: backend.get_baseline(ref))
            restored = "given size" if target is not None else "baseline" if baseline is not None else NOTHING_RECORDED
            result: ScaleResult = self._sent(f"the restore of {ref}", lambda: backend.restore_baseline(
                ref, target, wait=False, timeout=max(bound.remaining, MIN_SEND)
            ))
            outcome = RestoreOutcome.from_result(result, backend.name, restored)
        waits = config.wait and restored != NOTHING_RECORDED and not result.final.workers_up(result.effective)
        return self._metadata(
            RESTORE_TASK_TYPE, ref, config.backend, config.timeout, result.effective if waits else -1, outcome,
            framework_ready=False,
        )

    def _create_restart(self, config: RestartConfig, inputs: Dict[str, Any]) -> ScalingMetadata:
        """Send the restart once. A backend that fails or stalls while it is sent may have restarted
        the head anyway, so that ends the node FAILED (saying so) rather than letting it be sent again."""
        backend_name, ref = self._served(config.backend, inputs["cluster"])
        head_tier = validate_tier_name(inputs["head_hw_tier"], "head_hw_tier")
        with open_backend(backend_name) as backend:
            self._check_opened(backend, ref, "")
            capabilities = getattr(backend, "capabilities", None)
            if not getattr(capabilities, "observes_restarts", False):
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
        return self._metadata(
            RESTART_TASK_TYPE, ref, config.backend, config.timeout, 1 if config.wait else -1, outcome,
            framework_ready=False, awaits=AWAIT_HEAD, restart=restart_json(result),
        )

    def poll(self, meta: ScalingMetadata) -> Poll:
        """One look at the cluster: RUNNING until the node's goal is reached; SUCCEEDED with the typed
        outcome; FAILED at the deadline (after a scale or restore: with what was left in place and
        the command that undoes it). Sends nothing.

        The metadata comes from the caller, so it is checked as a template is:
        a refused one, a deadline more than :data:`MAX_NODE_TIMEOUT` after the
        start, or a backend, cluster or head not served is FAILED with a
        one-line message. A backend outage is RUNNING until the deadline.
        """
        if meta.error:
            return Poll(FAILED, meta.error)
        try:
            return self._poll(meta)
        except UNAVAILABLE_HERE as error:
            if time.time() >= meta.deadline:
                return Poll(FAILED, f"timed out; the backend is unavailable: {error}")
            return Poll(RUNNING, f"backend unavailable, reading again: {error}")
        except ScalingError as error:
            return Poll(FAILED, str(error))

    def _poll(self, meta: ScalingMetadata) -> Poll:
        if meta.task_type not in SERVED_TASK_TYPES:
            raise InvalidInputError("resource_meta.task_type", meta.task_type, ", ".join(SERVED_TASK_TYPES))
        if not 0 <= meta.deadline - meta.started <= MAX_NODE_TIMEOUT:
            raise InvalidInputError(
                "resource_meta.deadline", meta.deadline, f"at most {MAX_NODE_TIMEOUT:.0f} s after resource_meta.started"
            )
        meta.known_outcome()
        if meta.target < 0 and meta.awaits != AWAIT_DESIRED:
            return Poll(SUCCEEDED, outcome=meta.outcome_of())
        restart = meta.sent_restart() if meta.awaits == AWAIT_HEAD else None
        backend_name, ref = self._served(meta.backend or None, meta.cluster)
        with POLL_BACKENDS.backend(backend_name) as backend, shared_reads(SHARED_LINGER, SHARED_MAX_AGE):
            self._check_opened(backend, ref, meta.framework_url)
            try:
                if restart is not None:
                    done, state = backend.head_restarted(ref, restart)
                    readiness = Readiness(state.ready_workers, "new head Ready") if done else None
                    pending = f"a new Ready head (the restart sent at {restart.started_at}; never sent again)"
                    target = 1
                else:
                    state = backend.get_state(ref)
                    target = self._target(meta, state)
                    readiness, pending = None, f"{target} workers"
                    if state.workers_up(target):
                        removed = int(meta.known_outcome().get("previous_workers", 0)) > target
                        readiness, pending = self._framework(meta, ref, target, state, backend, removed)
            except UNAVAILABLE_HERE as error:
                if time.time() < meta.deadline:
                    raise
                return self._failed(meta, backend, ref, error, target=meta.target)
            elapsed = time.time() - meta.started
            if readiness is not None:
                return Poll(SUCCEEDED, outcome=self._finished(meta, state, elapsed, readiness))
            if time.time() >= meta.deadline:
                timeout = ScalingTimeoutError(
                    f"timed out after {elapsed:.0f}s waiting for {pending}; last state: {state.describe()}",
                    cluster=str(ref), state=state,
                )
                return self._failed(meta, backend, ref, timeout, target=target)
        return Poll(RUNNING, f"waiting for {pending}: {state.describe()}")

    @staticmethod
    def _target(meta: ScalingMetadata, state: ClusterState) -> int:
        """The workers awaited now: the desired count, or the node's count (a wait node's checked
        against what the cluster can reach; a scale or restore set it itself)."""
        if meta.awaits == AWAIT_DESIRED:
            return state.desired_workers
        if meta.task_type == WAIT_TASK_TYPE:
            return wait_target(state, meta.target)
        return meta.target

    @staticmethod
    def _failed(meta: ScalingMetadata, backend: Any, ref: ClusterRef, error: ScalingError, target: int) -> Poll:
        """FAILED with ``error``; after a scale or restore, with what it left in place and the remedy,
        as a node whose own wait failed says it (:func:`~flytekitplugins_ddlscale.backends._support.inplace.left_in_place`)."""
        if meta.task_type in (SCALE_TASK_TYPE, RESTORE_TASK_TYPE) and hasattr(backend, "in_place_error"):
            error = backend.in_place_error(ref, error, target, restoring=meta.task_type == RESTORE_TASK_TYPE)
        return Poll(FAILED, str(error))

    @staticmethod
    def _framework(
        meta: ScalingMetadata, ref: ClusterRef, target: int, state: ClusterState, backend: Any, removed: bool = False
    ) -> Tuple[Optional[Readiness], str]:
        """(readiness, '') once proven; (None, what is still awaited) while the framework lags: the
        target's workers registered, or, after a scale-down (``removed``), the removed ones dropped."""
        kind = ref.kind
        base = backend_proof(backend, state, kind)
        probe = probe_for(kind)
        if not meta.framework_ready or not enabled_by_env():
            return Readiness(state.ready_workers, f"{base}; framework check off"), ""
        if probe is None or (target <= 0 and not removed) or backend.capabilities.counts_registered_workers:
            return Readiness(state.ready_workers, base), ""
        endpoint = resolve_endpoint(kind, meta.framework_url or None, head_env(backend, ref))
        if endpoint is None:
            note = (
                "framework not checked (neither the backend nor the connector's environment says where the head "
                f"is: give the node a framework_url, or set ${kind_url_env(framework_of(kind))} for the connector)"
            )
            return Readiness(state.ready_workers, f"{base}; {note}"), ""
        what = f"{target} workers registered with {probe.registry} at {endpoint.url}"
        try:
            seen = read_registered(probe, endpoint, timeout=5.0)
        except HeadUnreachable as error:
            logger.debug("framework read of %s failed: %s", endpoint.url, error)
            return None, f"{what} ({NOT_READY})"
        if removed and seen > target:
            return None, f"{probe.registry} at {endpoint.url} to drop the removed workers ({seen} registered)"
        if seen < target:
            return None, f"{what} ({seen} registered)"
        ready = seen if state.ready_workers is None else min(seen, state.ready_workers)
        return Readiness(ready, f"{base}; {seen} workers registered with {probe.registry} at {endpoint.url}"), ""

    @staticmethod
    def _finished(meta: ScalingMetadata, state: ClusterState, elapsed: float, readiness: Readiness) -> Any:
        """The node's outcome once its goal is reached."""
        ready = UNKNOWN if readiness.ready_workers is None else readiness.ready_workers
        if meta.task_type == WAIT_TASK_TYPE:
            return ClusterReady.from_state(state, str(meta.known_outcome().get("backend", "")), elapsed, readiness)
        if meta.task_type == RESTART_TASK_TYPE:
            return meta.outcome_of(ready=True, waited=True, seconds_waited=elapsed)
        if meta.task_type == RESTORE_TASK_TYPE:
            return meta.outcome_of(workers=state.desired_workers, ready_workers=ready, waited=True, seconds_waited=elapsed)
        return meta.outcome_of(
            workers=state.desired_workers, ready_workers=ready, waited=True, seconds_waited=elapsed,
            readiness=readiness.proof,
        )
