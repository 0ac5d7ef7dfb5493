"""The connector's audit trail and its own Prometheus metrics: what it changed or refused, for whom.

Every ``create`` ends in one ``ddlscale-audit`` JSON line and one count of
``ddlscale_connector_creates_total``; metrics are registered when a connector is built
(:func:`start_audit`), never on import (docs/connector.md).
"""
import json
import logging
import threading
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Tuple

from ..errors import InvalidInputError, ScalingError, UnauthorizedError, shown_value
from .connector_meta import ScalingMetadata
from .connector_policy import Execution, chosen_backend, text_of
from .nodes import NODE_KINDS

logger = logging.getLogger("flytekitplugins_ddlscale.connector.audit")

SENT, DEFERRED, REFUSED, FAILED = "sent", "deferred", "refused", "failed"
"""A create's results: its change sent, left to the polls (backend unavailable), refused before anything
was sent (input, policy, owner), or failed (anything else, a head restart unconfirmed included)."""

LABEL_CHARS = 64
"""Longest label value counted: a project name is at most 63 characters; anything longer is cut."""

WAIT_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, float("inf"))

_metrics: Optional[Tuple[Any, Any]] = None
_metrics_lock = threading.Lock()


def start_audit() -> None:
    """What a connector does when it is built: register the metrics, and have the audit lines written whatever the
    process's logging level (the audit logger at INFO), to stderr where logging is not set up (as in ``pyflyte
    serve connector``: Python would drop them)."""
    _metrics_now()
    logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)


def _metrics_now() -> Tuple[Any, Any]:
    """The creates counter and the worker-wait histogram, registered on the default registry at the first call."""
    global _metrics
    with _metrics_lock:
        if _metrics is None:
            from prometheus_client import Counter, Histogram

            labels = ("project", "backend", "kind")
            _metrics = (
                Counter("ddlscale_connector_creates", "CreateTask calls of the ddlscale connector, by result",
                        labels + ("result",)),
                Histogram("ddlscale_connector_worker_wait_seconds",
                          "seconds from a node's create to its workers being ready", labels, buckets=WAIT_BUCKETS),
            )
        return _metrics


@dataclass(frozen=True)
class AuditEntry:
    """One create as the audit trail records it."""

    execution: Execution
    kind: str
    backend: str = ""
    cluster: str = ""
    before: Optional[int] = None
    after: Optional[int] = None
    rule: str = ""
    result: str = ""
    error: str = ""

    @classmethod
    def begin(cls, execution: Execution, task_type: str, custom: Any, values: Mapping[str, Any]) -> "AuditEntry":
        """What is known before the create's checks: the node kind, the backend (the connector's own where the
        node names none) and the cluster as asked."""
        kind = NODE_KINDS.get(task_type)
        backend = custom.get("backend") if isinstance(custom, dict) else None
        cluster = values.get("cluster") if isinstance(values, Mapping) else None
        if cluster is None and isinstance(custom, dict):
            cluster = custom.get("cluster")
        try:
            chosen = chosen_backend(backend) if backend is None or isinstance(backend, str) else ""
        except ScalingError:  # the connector's own backend setting does not parse: the create says so
            chosen = ""
        return cls(execution, kind.node if kind else str(task_type)[:LABEL_CHARS], chosen, text_of(cluster))

    def refused(self, error: BaseException) -> "AuditEntry":
        result = REFUSED if isinstance(error, (InvalidInputError, UnauthorizedError)) else FAILED
        return replace(self, result=result, error=str(error))

    def done(self, meta: ScalingMetadata) -> "AuditEntry":
        """This entry completed from what the create returned."""
        if meta.error:
            return replace(self, result=FAILED, error=meta.error)
        try:
            outcome = json.loads(meta.outcome)
        except ValueError:
            outcome = {}
        sizes = [outcome.get(name) if isinstance(outcome.get(name), int) else None for name in ("previous_workers", "workers")]
        return replace(self, cluster=meta.cluster, before=sizes[0],
                       after=sizes[1], result=DEFERRED if meta.pending else SENT)


def record(entry: AuditEntry) -> None:
    """Write ``entry``'s audit line and count it."""
    who = entry.execution
    line = {
        "execution": f"{who.project}/{who.domain}/{who.name}/{who.node}", "project": who.project, "domain": who.domain,
        "identity": who.identity, "service_account": who.service_account, "kind": entry.kind,
        "backend": entry.backend, "cluster": entry.cluster, "before": entry.before, "after": entry.after,
        "rule": entry.rule, "result": entry.result, "error": entry.error,
    }
    shown = {key: _clip(value) for key, value in line.items()}
    logger.info("ddlscale-audit %s", json.dumps(shown, ensure_ascii=False, separators=(",", ":")))
    label = (who.project[:LABEL_CHARS], entry.backend[:LABEL_CHARS], entry.kind)
    _metrics_now()[0].labels(*label, entry.result).inc()


def observe_wait(meta: ScalingMetadata, seconds: float) -> None:
    """Count how long the node of ``meta`` waited for its workers."""
    kind = NODE_KINDS.get(meta.task_type)
    label = (meta.project[:LABEL_CHARS], chosen_backend(meta.backend)[:LABEL_CHARS], kind.node if kind else "")
    _metrics_now()[1].labels(*label).observe(seconds)


def _clip(value: Any) -> Any:
    """``value`` as a log line carries it: strings of outside origin cut to a bounded length."""
    if isinstance(value, str) and len(value) > 200:
        return shown_value(value)
    return value
