"""A node's or phase's page as a tab of the Flyte 2 task's Report: Timeline rows, worker plot, worker-seconds.

The rows are Flyte 2's own ``flyte.report.Timeline`` widget (one per change
of the worker count, and one per marked moment such as the restore); the plot
and the worker-seconds by tier are the same HTML as the flytekit Deck
(:func:`..deck.render_html`). A task shows its Report when it is defined with
``@env.task(report=True)``; elsewhere (no task, or no report asked for)
Flyte 2 keeps the page in a report nobody reads, which is harmless.
"""
from typing import List, Mapping, NamedTuple

from .._core.deck import render_html
from .._core.timeline import WorkerTimeline
from .._core.wording import plural


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


def publish_report(title: str, timeline: WorkerTimeline, facts: Mapping[str, object]) -> None:
    """Add ``title``'s tab to the running task's Report: the Timeline rows, then the plot and the facts."""
    import flyte.report

    tab = title.split(":", 1)[0]
    widget = flyte.report.Timeline(tab)
    widget.heading(title)
    for row in timeline_rows(timeline):
        widget.row(icon=row.icon, label=row.label, meta=row.meta)
    flyte.report.get_tab(tab).log(render_html(title, timeline, facts))
