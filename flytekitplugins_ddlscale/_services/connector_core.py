"""What every connector for the scaling nodes does, whichever Flyte serves it: check, send, poll.

Both connectors hand :class:`ScalingService` a node's task type, ``custom`` and inputs at ``create`` and
get the resource metadata (:mod:`.connector_meta`), which every poll hands back: what a poll waits for
stays there, so a restarted connector goes on where it was (docs/connector.md).
"""
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, Mapping, Optional, Tuple, Type, TypeVar, Union
from urllib.parse import urlsplit

from .connector_audit import AuditEntry, record, start_audit
from .connector_meta import ScalingMetadata
from .connector_policy import ConnectorPolicy, Execution, NotServedError, Rule, chosen_backend, namespace_of
from ..errors import (
    ClusterNotFoundError, InvalidInputError, NeverReachedError, ScalingError, ScalingTimeoutError, TransientError,
    UnconfirmedChangeError,
)
from .readiness import Readiness, backend_proof
from .._framework.endpoints import Endpoint, enabled_by_env, framework_of, kind_url_env, resolve_endpoint
from .._framework.probes import probe_for
from .._framework.wait import HeadUnreachable, read_registered
from ..models import ClusterState
from .nodes.kinds import AWAIT_DESIRED, AWAIT_HEAD, Creation, NodeKind, Sent
from .nodes import NODE_KINDS
from .nodes.names import TASK_TYPES
from .opening import BackendPool
from ..backends._base import ClusterBackend, SharedReads
from ..refs import ClusterRef
from .._core import settings
from .._core.redaction import install_redaction
from .._core.validation import MAX_NODE_TIMEOUT

logger = logging.getLogger("flytekitplugins_ddlscale.connector")

SERVED_TASK_TYPES = TASK_TYPES
POLL_BACKENDS = BackendPool()
"""The backends every create and poll goes through, kept open: one API client and outage tracker for all."""
SHARED_READS = SharedReads(linger=60.0, max_age=1.0)
"""How polls share reads: a namespace's watch outlives its last poll by ``linger`` s, a scaler read at
most ``max_age`` s old answers another poll. Each poll adds its budget and ``not_before`` (its create)."""
NOT_READY = "framework endpoint not ready or unreachable"
"""All a caller learns of a failed framework read (details go to the debug log): a template cannot map
what listens where."""
RUNNING, SUCCEEDED, FAILED = "RUNNING", "SUCCEEDED", "FAILED"
"""A poll's answers (named like Flyte's task execution phases, which each connector maps them to)."""
UNAVAILABLE_HERE = (TransientError, NeverReachedError)
"""The backend unavailable for now: a repeatable change is left to the polls, a poll reads again until
the deadline."""

SENT_KEPT = 10_000
"""Deferred changes whose send this process remembers (oldest forgotten first), so they are not sent twice."""

C = TypeVar("C")


@dataclass(frozen=True)
class Poll:
    """One poll's answer: ``state`` is :data:`RUNNING`, :data:`SUCCEEDED` (with ``outcome``, the node's
    typed output) or :data:`FAILED` (``message`` says why in one line)."""

    state: str
    message: str = ""
    outcome: Any = None
    links: Tuple[Tuple[str, str], ...] = ()
    """(name, URL) links the Flyte UI shows: the framework's dashboard, where ``$DDLSCALE_CONNECTOR_DASHBOARD_URL`` says where a browser reaches it."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """What the Flyte UI shows in the task's details: the counts the poll saw (:func:`progress_info`)."""


def node_config(config_type: Type[C], custom: Any) -> C:
    """The node's configuration from a template's ``custom``, checked (each field's own check names it)."""
    try:
        return config_type.from_custom(custom)  # type: ignore[attr-defined]
    except ScalingError:
        raise
    except (TypeError, ValueError, AttributeError) as error:
        # A field the configuration class does not check itself (e.g. an unhashable value).
        raise InvalidInputError("custom", type(error).__name__, "the configuration the node was serialized with") from None


def head_env(backend: Any, ref: ClusterRef, environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Where a node would find ``ref``'s head: the connector's own ``DDLSCALE_*`` settings, then the
    variables the backend reports for the cluster (the connector's other variables are left out)."""
    env = settings.ddlscale_variables(environ)
    try:
        env.update(backend.connection_env(ref))
    except ScalingError as error:
        logger.debug("no head address for %s: %s", ref, error)
    return env


DASHBOARDS = {"dask": ("Dask dashboard", "/status"), "ray": ("Ray dashboard", ""), "spark": ("Spark master web UI", "")}
"""Per framework: the link's name in the Flyte UI, and the page of the head's web server it opens."""


def head_links(backend: Any, ref: ClusterRef, framework_url: str) -> Tuple[Tuple[str, str], ...]:
    """The framework's dashboard of ``ref`` as a (name, URL) link: ``$DDLSCALE_CONNECTOR_DASHBOARD_URL``
    filled in with the cluster and its head; none where that setting is unset or names an unknown head."""
    template = settings.CONNECTOR_DASHBOARD_URL.value()
    framework = framework_of(ref.kind)
    if template is None or framework not in DASHBOARDS:
        return ()
    fields: Dict[str, Any] = {"kind": ref.kind, "name": ref.name, "namespace": namespace_of(ref, backend)}
    try:
        endpoint = resolve_endpoint(ref.kind, framework_url or None, head_env(backend, ref))
    except (ScalingError, ValueError) as error:
        logger.debug("no head address for %s's dashboard link: %s", ref, error)
        endpoint = None
    if endpoint is not None:
        head = urlsplit(endpoint.url)
        host = head.hostname or ""
        fields.update(host=host, service=host.split(".")[0], port=head.port or (443 if head.scheme == "https" else 80))
    try:
        url = template.format(**fields)
    except KeyError:  # the template names the head, and no one says where it is
        return ()
    name, page = DASHBOARDS[framework]
    return ((name, url.rstrip("/") + page),)


def progress_info(ref: ClusterRef, target: int, state: ClusterState, elapsed: float) -> Dict[str, Any]:
    """What a poll saw, for the Flyte UI's task details: the counts awaited, desired and ready."""
    return {
        "cluster": str(ref), "status": state.status, "target_workers": target,
        "desired_workers": state.desired_workers, "existing_workers": state.existing_workers,
        "ready_workers": state.ready_workers, "elapsed_seconds": round(elapsed, 1),
    }


@dataclass(frozen=True)
class _Look:
    """What one poll saw: the state, the workers awaited, and their readiness once proven (else what is
    still ``pending``)."""

    state: ClusterState
    target: int
    readiness: Optional[Readiness]
    pending: str


def _removed(meta: ScalingMetadata, target: int) -> bool:
    """Whether the node's change removed workers (a scale-down to ``target``)."""
    return int(meta.known_outcome().get("previous_workers", 0)) > target


class ScalingService:
    """Create and poll for the four scaling nodes, under the policy fixed when it is built: a refused
    template raises its one-line error, a malformed metadata polls FAILED; nothing is sent for either."""

    def __init__(self, policy: Optional[ConnectorPolicy] = None) -> None:
        install_redaction()
        self.policy = policy if policy is not None else ConnectorPolicy.from_env()
        start_audit()  # the connector's own metrics and audit lines, from its start
        self._creation = Creation(self.policy, POLL_BACKENDS)
        self._sent: "OrderedDict[bytes, ScalingMetadata]" = OrderedDict()
        self._sent_lock = threading.Lock()

    def create(
        self, task_type: str, custom: Any, values: Mapping[str, Any], execution: Optional[Execution] = None
    ) -> ScalingMetadata:
        """Check the node, send its change (without waiting) and return what :meth:`poll` needs.

        A refused node raises its one-line error before anything is sent. A backend unavailable
        (:data:`UNAVAILABLE_HERE`) leaves a repeatable change to the polls (``pending``); a head restart
        that may have gone out unconfirmed comes back as a metadata whose first poll is FAILED, as a
        FlytePropeller retry would send it again. ``execution`` is checked against the per-project rules;
        every create ends in one audit line (:mod:`.connector_audit`).
        """
        execution = execution if execution is not None else Execution()
        entry = AuditEntry.begin(execution, task_type, custom, values)
        try:
            rule = self.policy.rules.rule_for(execution) if self.policy.rules is not None else None
            entry = replace(entry, rule=rule.name if rule is not None else "")
            meta = replace(self._create(task_type, custom, values, rule), project=execution.project)
        except Exception as error:
            record(entry.refused(error))
            raise
        record(entry.done(meta))
        return meta

    def _create(self, task_type: str, custom: Any, values: Mapping[str, Any], rule: Optional[Rule]) -> ScalingMetadata:
        """:meth:`create` under ``rule`` (None: no per-project rule), without its audit."""
        kind = NODE_KINDS.get(task_type)
        if kind is None:
            raise InvalidInputError("task_type", task_type, ", ".join(NODE_KINDS))
        config = node_config(kind.config, custom)
        given = kind.given(config, values)
        if rule is not None:
            self._check_rule(rule, kind, config, given)
        try:
            return self._metadata(kind, config, *self._sent_with_version(kind, config, given))
        except UnconfirmedChangeError as error:
            logger.info("a %s may have been sent unconfirmed: %s", task_type, error)
            return ScalingMetadata.refused(task_type, error)
        except UNAVAILABLE_HERE as error:
            if not kind.repeatable:
                raise
            logger.info("%s not sent yet, the polls send it: %s", kind.change, error)
            return self._deferred(kind, config, given)

    def _check_rule(self, rule: Rule, kind: NodeKind, config: Any, given: Mapping[str, Any]) -> None:
        """Refuse what ``rule`` does not allow this node (no request sent), then, where it names an owner, a
        cluster not labelled as that owner's (one read of the cluster; only the kubernetes backend keeps one)."""
        backend_name, ref = self._creation.served(config.backend, given["cluster"])
        with POLL_BACKENDS.backend(backend_name) as backend:
            rule.check(backend_name, ref, namespace_of(ref, backend), given if kind.changes_cluster else {})
            owner = rule.allow.get("owner")
            if owner is None:
                return
            check_owner = getattr(backend, "check_owner", None)
            if check_owner is None:
                raise NotServedError(
                    "backend", backend_name, "kubernetes",
                    reason=f"rule {rule.name!r} names an owner, and only a backend with owner labels can check it",
                )
            check_owner(ref, owner)

    def _deferred(self, kind: NodeKind, config: Any, given: Mapping[str, Any]) -> ScalingMetadata:
        """The metadata of a node whose change ``create`` could not send: the polls send it."""
        now = time.time()
        _, ref = self._creation.served(config.backend, given["cluster"])
        pending = json.dumps({"custom": config.to_custom(), "inputs": dict(given)}, separators=(",", ":"))
        return ScalingMetadata(
            task_type=kind.task_type, cluster=str(ref), backend=config.backend or "", target=-1,
            started=now, deadline=now + config.timeout, outcome="{}", pending=pending,
        )

    def _sent_with_version(self, kind: NodeKind, config: Any, given: Mapping[str, Any]) -> Tuple[Sent, str]:
        """``kind``'s create sent, and the version of the cluster's object it left (the backend's
        ``version_seen``: the polls of another connector replica trust their cache from there)."""
        sent = kind.create(self._creation, config, given)
        with POLL_BACKENDS.backend(self.policy.backend(config.backend)) as backend:
            return sent, backend.version_seen(sent.cluster)

    @staticmethod
    def _metadata(kind: NodeKind, config: Any, sent: Sent, cluster_version: str) -> ScalingMetadata:
        """What the polls need after ``create`` sent ``sent``, leaving the cluster at ``cluster_version``."""
        now = time.time()
        outcome = sent.outcome if isinstance(sent.outcome, dict) else asdict(sent.outcome)
        return ScalingMetadata(
            task_type=kind.task_type, cluster=str(sent.cluster), backend=config.backend or "", target=sent.target,
            started=now, deadline=now + config.timeout, outcome=json.dumps(outcome),
            framework_ready=sent.framework_ready, framework_url=sent.framework_url, awaits=sent.awaits,
            restart=sent.restart, cluster_version=cluster_version,
        )

    def poll(self, meta: ScalingMetadata) -> Poll:
        """One look at the cluster: RUNNING until the node's goal is reached, SUCCEEDED with the typed
        outcome, FAILED at the deadline or in one line for a metadata checked as a template is. Sends
        nothing but a change its create left to the polls."""
        if meta.error:
            return Poll(FAILED, meta.error)
        if meta.pending:
            try:
                sent = self._sent_pending(meta)
            except UNAVAILABLE_HERE as error:
                return self.unsent_answer(meta, error.message) or Poll(FAILED, str(error))
            except ScalingError as error:
                return Poll(FAILED, str(error))
            if sent is None:
                late = "no send went through before it"
                return self.unsent_answer(meta, late) or Poll(FAILED, late)
            meta = sent
        try:
            return self._poll(meta)
        except UNAVAILABLE_HERE as error:
            if time.time() >= meta.deadline:
                return Poll(FAILED, f"timed out; the backend is unavailable: {error}")
            return Poll(RUNNING, f"backend unavailable, reading again: {error}")
        except ScalingError as error:
            return Poll(FAILED, str(error))

    def cached_answer(self, meta: ScalingMetadata) -> Optional[Poll]:
        """:meth:`poll`'s answer from what this process already holds, at once (for an event loop): nothing
        sent, no wait. None where it needs more or the metadata is at fault: the caller polls then."""
        if meta.error:
            return Poll(FAILED, meta.error)
        if meta.pending or meta.awaits == AWAIT_HEAD or time.time() >= meta.deadline:
            return None
        try:
            kind, ref, backend_name = self._polled(meta)
            if meta.target < 0 and meta.awaits != AWAIT_DESIRED:
                return Poll(SUCCEEDED, outcome=meta.outcome_of())
            with POLL_BACKENDS.kept(backend_name) as backend:
                if backend is None:
                    return None
                self._opened(backend, ref, meta)
                state = backend.cached_state(ref, replace(SHARED_READS, not_before=meta.started))
                if state is None:
                    return None
                target = self._target(meta, kind, state)
                look = _Look(state, target, None, f"{target} workers")
                if state.workers_up(target):
                    proven = self._proven(meta, ref, look, backend)
                    if not isinstance(proven, Readiness):
                        return None  # the framework is read from a reader thread
                    look = replace(look, readiness=proven)
                return self._decided(meta, kind, backend, ref, look)
        except ScalingError:
            return None

    def failed_at_deadline(self, meta: ScalingMetadata, error: ScalingError) -> ScalingError:
        """``error`` (the deadline passed, the backend silent) worded as the node's kind words a failed wait
        where the backend is open here, else as it is. Never blocks (an event loop calls it)."""
        kind = NODE_KINDS.get(meta.task_type)
        if kind is None:
            return error
        try:
            backend_name, ref = self._creation.served(meta.backend or None, meta.cluster)
            with POLL_BACKENDS.kept(backend_name) as backend:
                return kind.failed(backend, ref, error, meta.target) if backend is not None else error
        except ScalingError:
            # The metadata's own fault is the poll's to report; the node ends with what it waited for.
            return error

    def unsent_answer(self, meta: ScalingMetadata, why: str) -> Optional[Poll]:
        """While the change the create left to the polls is unsent (``why``): RUNNING, or FAILED past the
        deadline saying it was never sent. None when ``meta`` has no such change (or this process sent it)."""
        kind = NODE_KINDS.get(meta.task_type)
        if not meta.pending or kind is None:
            return None
        with self._sent_lock:
            if meta.encode() in self._sent:
                return None
        if time.time() < meta.deadline:
            return Poll(RUNNING, f"backend unavailable, sending {kind.change} again: {why}")
        never = ScalingTimeoutError(
            f"timed out after {time.time() - meta.started:.0f}s; {kind.change} was never sent: the backend was "
            f"unavailable from create to the node's deadline ({why}); nothing was left in place",
            cluster=meta.cluster,
        )
        return Poll(FAILED, str(never))

    def _sent_pending(self, meta: ScalingMetadata) -> Optional[ScalingMetadata]:
        """The metadata ``create`` would have returned had it sent ``meta``'s deferred change (sent now with
        its checks, or remembered from this process's earlier send); None past the deadline, nothing sent."""
        key = meta.encode()
        with self._sent_lock:
            known = self._sent.get(key)
        if known is not None:
            return known
        kind = self._checked_kind(meta)
        if not kind.repeatable:
            raise InvalidInputError(
                "resource_meta.pending", "<a change>", "'' (a head restart is sent by its create only)"
            )
        custom, values = meta.pending_change(kind.inputs)
        config = node_config(kind.config, custom)
        if time.time() >= meta.deadline:
            return None
        sent = self._metadata(kind, config, *self._sent_with_version(kind, config, kind.given(config, values)))
        sent = replace(sent, started=meta.started, deadline=meta.deadline, project=meta.project)
        logger.info("%s of %s sent after a backend outage", kind.change, meta.cluster)
        record(AuditEntry(Execution(project=meta.project), kind.node, chosen_backend(meta.backend)).done(sent))
        with self._sent_lock:
            self._sent[key] = sent
            while len(self._sent) > SENT_KEPT:
                self._sent.popitem(last=False)
        return sent

    @staticmethod
    def _checked_kind(meta: ScalingMetadata) -> NodeKind:
        """``meta``'s node kind, once its task type and its deadline are checked."""
        kind = NODE_KINDS.get(meta.task_type)
        if kind is None:
            raise InvalidInputError("resource_meta.task_type", meta.task_type, ", ".join(NODE_KINDS))
        if not 0 <= meta.deadline - meta.started <= MAX_NODE_TIMEOUT:
            raise InvalidInputError(
                "resource_meta.deadline", meta.deadline, f"at most {MAX_NODE_TIMEOUT:.0f} s after resource_meta.started"
            )
        return kind

    def _polled(self, meta: ScalingMetadata) -> Tuple[NodeKind, ClusterRef, str]:
        """``meta`` checked (its kind, deadline, outcome and restart): its kind, cluster and backend's name."""
        kind = self._checked_kind(meta)
        meta.known_outcome()
        if meta.awaits == AWAIT_HEAD:
            meta.sent_restart()
        backend_name, ref = self._creation.served(meta.backend or None, meta.cluster)
        return kind, ref, backend_name

    def _opened(self, backend: ClusterBackend, ref: ClusterRef, meta: ScalingMetadata) -> None:
        self._creation.check_opened(backend, ref, meta.framework_url)
        if meta.cluster_version:
            # The create may have been another replica's: this process's cache may not hold its write yet.
            backend.expect_version(ref, meta.cluster_version)

    def _poll(self, meta: ScalingMetadata) -> Poll:
        kind, ref, backend_name = self._polled(meta)
        if meta.target < 0 and meta.awaits != AWAIT_DESIRED:
            return Poll(SUCCEEDED, outcome=meta.outcome_of())
        # A shared read begun before the create's change (perhaps another replica's) must not answer for it.
        reads = replace(SHARED_READS, budget=float(settings.CONNECTOR_CALL_BUDGET.value()), not_before=meta.started)
        with POLL_BACKENDS.backend(backend_name) as backend:
            self._opened(backend, ref, meta)
            try:
                look = self._looked(meta, kind, backend, ref, reads)
            except UNAVAILABLE_HERE as error:
                if time.time() < meta.deadline:
                    raise
                return Poll(FAILED, str(kind.failed(backend, ref, error, meta.target)))
            return self._decided(meta, kind, backend, ref, look)

    def _looked(
        self, meta: ScalingMetadata, kind: NodeKind, backend: ClusterBackend, ref: ClusterRef, reads: SharedReads
    ) -> "_Look":
        """What one poll sees of ``ref``: its state, and the readiness of what the node awaits once proven."""
        if meta.awaits == AWAIT_HEAD:
            restart = meta.sent_restart()
            done, state = backend.head_restarted(ref, restart, reads)
            readiness = Readiness(state.ready_workers, "new head Ready") if done else None
            pending = f"a new Ready head (the restart sent at {restart.started_at}; never sent again)"
            return _Look(state, 1, readiness, pending)
        try:
            state = backend.get_state(ref, reads)
        except ClusterNotFoundError as missing:
            # Its operator has not made the object holding its size yet: the node waits, as a backend wait does.
            if not missing.pending or missing.state is None:
                raise
            state = missing.state
        target = self._target(meta, kind, state)
        look = _Look(state, target, None, f"{target} workers")
        return self._framework(meta, ref, look, backend) if state.workers_up(target) else look

    @staticmethod
    def _target(meta: ScalingMetadata, kind: NodeKind, state: ClusterState) -> int:
        return state.desired_workers if meta.awaits == AWAIT_DESIRED else kind.awaited(meta.target, state)

    @staticmethod
    def _decided(
        meta: ScalingMetadata, kind: NodeKind, backend: ClusterBackend, ref: ClusterRef, look: "_Look"
    ) -> Poll:
        """The poll's answer once ``look`` was read: SUCCEEDED once ready, FAILED past the deadline, else RUNNING."""
        elapsed = time.time() - meta.started
        shown: Dict[str, Any] = {
            "links": head_links(backend, ref, meta.framework_url),
            "info": progress_info(ref, look.target, look.state, elapsed),
        }
        if look.readiness is not None:
            return Poll(SUCCEEDED, outcome=kind.finish(meta, look.state, elapsed, look.readiness), **shown)
        if time.time() >= meta.deadline:
            timeout = ScalingTimeoutError(
                f"timed out after {elapsed:.0f}s waiting for {look.pending}; last state: {look.state.describe()}",
                cluster=str(ref), state=look.state,
            )
            return Poll(FAILED, str(kind.failed(backend, ref, timeout, look.target)), **shown)
        return Poll(RUNNING, f"waiting for {look.pending}: {look.state.describe()}", **shown)

    @staticmethod
    def _proven(
        meta: ScalingMetadata, ref: ClusterRef, look: "_Look", backend: ClusterBackend
    ) -> Union[Readiness, Endpoint]:
        """The workers' readiness where no framework read is needed (its check off or needless, or no one
        says where the head is), else the head to read."""
        state, kind = look.state, ref.kind
        base = backend_proof(backend, state, kind)
        removed = _removed(meta, look.target)
        if not meta.framework_ready or not enabled_by_env():
            return Readiness(state.ready_workers, f"{base}; framework check off")
        needless = look.target <= 0 and not removed
        if probe_for(kind) is None or needless or backend.capabilities.counts_registered_workers:
            return Readiness(state.ready_workers, base)
        endpoint = resolve_endpoint(kind, meta.framework_url or None, head_env(backend, ref))
        if endpoint is None:
            note = (
                "framework not checked (neither the backend nor the connector's environment says where the head "
                f"is: give the node a framework_url, or set ${kind_url_env(framework_of(kind))} for the connector)"
            )
            return Readiness(state.ready_workers, f"{base}; {note}")
        return endpoint

    def _framework(self, meta: ScalingMetadata, ref: ClusterRef, look: "_Look", backend: ClusterBackend) -> "_Look":
        """``look`` once its workers are up: ready once proven, else what the framework still lags in (the
        target's workers registered, or, after a scale-down, the removed ones dropped)."""
        proven = self._proven(meta, ref, look, backend)
        if isinstance(proven, Readiness):
            return replace(look, readiness=proven)
        probe, target, state = probe_for(ref.kind), look.target, look.state
        assert probe is not None
        what = f"{target} workers registered with {probe.registry} at {proven.url}"
        try:
            seen = read_registered(probe, proven, timeout=5.0)
        except HeadUnreachable as error:
            logger.debug("framework read of %s failed: %s", proven.url, error)
            return replace(look, pending=f"{what} ({NOT_READY})")
        if _removed(meta, target) and seen > target:
            dropped = f"{probe.registry} at {proven.url} to drop the removed workers ({seen} registered)"
            return replace(look, pending=dropped)
        if seen < target:
            return replace(look, pending=f"{what} ({seen} registered)")
        ready = seen if state.ready_workers is None else min(seen, state.ready_workers)
        proof = f"{seen} workers registered with {probe.registry} at {proven.url}"
        return replace(look, readiness=Readiness(ready, f"{backend_proof(backend, state, ref.kind)}; {proof}"))
