"""The Flyte 2 task class of the scaling nodes: a ``ddlscale_*`` task type served by the connector, no pod,
declared as flyte's own connector plugins are. In local mode it adds the node's summary line, Report tab and
the note of the cluster it changes. Imports ``flyte``: imported when a node is defined.
"""
import dataclasses
import time
from typing import Any, Dict

from flyte.connectors import AsyncConnectorExecutorMixin
from flyte.extend import TaskTemplate, is_initialized
from flyte.models import SerializationContext

from .._services.nodes import interrupted
from .._services.nodes.kinds import NodeKind
from .._core.progress import emit_line
from ..refs import parse_cluster
from .._core.timeline import WorkerTimeline
from . import connector  # noqa: F401 - registers the connectors flyte's local runner looks up
from .report import publish_report

@dataclasses.dataclass(kw_only=True)
class ScalingNodeTask(AsyncConnectorExecutorMixin, TaskTemplate):
    """A scaling node as a Flyte 2 task; awaiting it in a parent task gives the node's typed outcome.
    ``node_config`` (``ScaleConfig``, ...; ``config`` is flyte's own method) is sent as the template's
    ``custom``; ``kind`` is its node type."""

    node_config: Any
    kind: NodeKind

    def custom_config(self, sctx: SerializationContext) -> Dict[str, Any]:
        """The template's ``custom``: the node's configuration, which the connector reads back."""
        return self.node_config.to_custom()

    async def execute(self, **kwargs: Any) -> Any:
        """Local mode: the node through flyte's local connector runner (which needs ``flyte.init()``: without
        it the node fails saying so before anything is sent), then its Report tab and summary line."""
        if not is_initialized():
            raise RuntimeError(
                f"{self.short_name}: a ddlscale node runs through flyte's local connector runner, which needs "
                "flyte.init() first (no arguments for a local run): call flyte.init() before "
                "flyte.with_runcontext(mode=\"local\").run(...)"
            )
        if self.kind.changes_cluster:
            interrupted.remember(self.node_config.backend, parse_cluster(kwargs.get("cluster", self.node_config.cluster)))
        started = time.monotonic()
        (outcome,) = await super().execute(**kwargs)
        seconds = time.monotonic() - started
        publish_report(
            f"{self.kind.title}: {self.name}", outcome_timeline(outcome, seconds), vars(outcome), self.short_name
        )
        emit_line(self.kind.summary(self.short_name, outcome, seconds))
        return outcome


def outcome_timeline(outcome: Any, seconds: float) -> WorkerTimeline:
    """The node's worker counts as its outcome states them, before (when it says) and at the end: the
    connector read the cluster on its own polls, so there is no sampled series."""
    timeline = WorkerTimeline(clock=lambda: seconds)
    tier = getattr(outcome, "worker_hw_tier", "") or None
    if hasattr(outcome, "previous_workers"):
        timeline.add(outcome.previous_workers, seconds=0.0)
    workers = outcome.ready_workers if isinstance(getattr(outcome, "ready_workers", None), int) else None
    if workers is not None and workers >= 0:
        timeline.add(workers, tier, seconds=seconds)
    timeline.finish()
    return timeline
