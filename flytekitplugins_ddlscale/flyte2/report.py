"""A node's or phase's page as a tab of the Flyte 2 task's Report: Timeline rows, worker plot, worker-seconds
(the flytekit Deck's HTML). In a local run the tab is saved at once and a line says where.
"""
from pathlib import Path
from typing import List, Mapping, NamedTuple, Optional

from .._core.deck import render_html
from .._core.progress import emit_line, plural
from .._core.timeline import WorkerTimeline

REPORT_FILE = "report.html"
"""The file of a task's Report under its output path (flyte's name for it)."""


class Row(NamedTuple):
    """One line of the Timeline widget."""

    icon: str
    label: str
    meta: str


def timeline_rows(timeline: WorkerTimeline) -> List[Row]:
    """The rows for ``timeline``: each change of the worker count and each mark, in time order."""
    events = []
    shown = None
    for sample in timeline.samples:
        if sample.workers == shown:
            continue
        icon = "•" if shown is None else ("▲" if sample.workers > shown else "▼")
        tier = f" on {sample.tier}" if sample.tier else ""
        events.append((sample.seconds, 1, Row(icon, f"{plural(sample.workers, 'worker')}{tier}", "")))
        shown = sample.workers
    for seconds, label in timeline.marks:
        events.append((seconds, 0, Row("⏵", label, "")))
    events.sort(key=lambda event: (event[0], event[1]))
    return [row._replace(meta=f"+{seconds:.1f} s") for seconds, _, row in events]


def publish_report(title: str, timeline: WorkerTimeline, facts: Mapping[str, object], label: str = "") -> None:
    """Add ``title``'s tab to the running task's Report: the Timeline rows, then the plot and the facts; in a
    local run the Report is saved now and a line starting with ``label`` (default: ``title``) says where."""
    import flyte.report

    tab = title.split(":", 1)[0]
    widget = flyte.report.Timeline(tab)
    widget.heading(title)
    for row in timeline_rows(timeline):
        widget.row(icon=row.icon, label=row.label, meta=row.meta)
    flyte.report.get_tab(tab).log(render_html(title, timeline, facts))
    where = save_local_report()
    if where is not None:
        emit_line(f"{label or title}: Report written to {where}")


def save_local_report() -> Optional[str]:
    """In a local run's task: the task's Report written to its output path, and that file; elsewhere None.
    Written directly, not through flyte's ``flush``, which cannot be called from the event loop a node runs
    in, nor awaited from a phase's thread."""
    import flyte

    context = flyte.ctx()
    if not context or context.mode != "local" or context.report is None or "://" in context.output_path:
        return None
    path = Path(context.output_path) / REPORT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(context.report.get_final_report(), encoding="utf-8")
    return str(path)
