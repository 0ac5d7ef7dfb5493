"""The Flyte 2 task class of the scaling nodes: a ``ddlscale_*`` task type served by the connector, no pod.

Declared the way Flyte 2's own connector plugins declare theirs (a
``flyte.extend.TaskTemplate`` with ``AsyncConnectorExecutorMixin``, no
image, the node's configuration as the template's ``custom``):

* on a cluster, Flyte 2 hands the template to the connector that serves its
  task type (:mod:`.connector`, loaded by flyte's connector server ``c0``):
  no pod, nothing of this module runs;
* in local mode, flyte's local connector runner (the mixin's ``execute``)
  calls the same registered connector in-process: ``create``, then ``get``
  every 3 s until it ends. Around that run this class adds what a node
  shows in a local run: its summary line and its Report tab (saved, with a
  line saying where; the template asks for no Report), and the
  cluster it changes is noted for the interrupt report (:mod:`.._services.nodes.interrupted`).

Imports ``flyte``: imported when a node is defined, never with the package.
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

    ``settings`` is the node's configuration (``ScaleConfig``, ...), sent as
    the template's ``custom``; ``kind`` is its node type (Report tab title,
    summary line, whether it changes the cluster).
    """

    settings: Any
    kind: NodeKind

    def custom_config(self, sctx: SerializationContext) -> Dict[str, Any]:
        """The template's ``custom``: the node's configuration, which the connector reads back."""
        return self.settings.to_custom()

    async def execute(self, **kwargs: Any) -> Any:
        """Local mode: the node through flyte's local connector runner, then its Report tab and summary line.

        flyte's runner needs ``flyte.init()`` (no arguments for a local run),
        as for every connector task; without it the node fails saying so
        before anything is sent.
        """
        if not is_initialized():
            raise RuntimeError(
                f"{self.short_name}: a ddlscale node runs through flyte's local connector runner, which needs "
                "flyte.init() first (no arguments for a local run): call flyte.init() before "
                "flyte.with_runcontext(mode=\"local\").run(...)"
            )
        if self.kind.changes_cluster:
            interrupted.remember(self.settings.backend, parse_cluster(kwargs.get("cluster", self.settings.cluster)))
        started = time.monotonic()
        (outcome,) = await super().execute(**kwargs)
        seconds = time.monotonic() - started
        publish_report(
            f"{self.kind.title}: {self.name}", outcome_timeline(outcome, seconds), vars(outcome), self.short_name
        )
        emit_line(self.kind.summary(self.short_name, outcome, seconds))
        return outcome


def outcome_timeline(outcome: Any, seconds: float) -> WorkerTimeline:
    """The node's worker counts as its outcome states them: before (when it says) and at the end.

    The connector reads the cluster on its own polls, so the node's page
    shows the two counts the outcome carries rather than a sampled series.
    """
    timeline = WorkerTimeline(clock=lambda: seconds)
    tier = getattr(outcome, "worker_hw_tier", "") or None
    if hasattr(outcome, "previous_workers"):
        timeline.add(outcome.previous_workers, seconds=0.0)
    workers = outcome.ready_workers if isinstance(getattr(outcome, "ready_workers", None), int) else None
    if workers is not None and workers >= 0:
        timeline.add(workers, tier, seconds=seconds)
    timeline.finish()
    return timeline
