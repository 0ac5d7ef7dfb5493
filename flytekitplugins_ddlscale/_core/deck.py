"""Flyte Decks for scaling nodes and phases: worker count over time as an inline SVG (no plotting library in
the task image) and worker-seconds by tier; a local run lists where flytekit wrote each Deck at exit."""
import atexit
import html
import re
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from .timeline import Sample, WorkerTimeline

if TYPE_CHECKING:
    from flytekit import Deck
    from flytekit.core.context_manager import FlyteContext

END_MARGIN = 0.05
"""Share of the time axis kept after the end, so a change at the very end (the restore) stays visible."""


def render_svg(
    samples: Sequence[Sample], duration: float, width: int = 640, height: int = 220,
    marks: Sequence[Tuple[float, str]] = (),
) -> str:
    """A step plot of worker count over time as an inline ``<svg>`` element; ``marks`` as dashed lines."""
    left, right, top, bottom = 48, 16, 16, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    last = max(duration, samples[-1].seconds if samples else 0.0, 1e-6)
    end = last * (1 + END_MARGIN)
    peak = max([s.workers for s in samples] + [1])

    def x(seconds: float) -> float:
        return left + plot_w * seconds / end

    def y(workers: int) -> float:
        return top + plot_h * (1 - workers / peak)

    points: List[Tuple[float, float]] = []
    for current, following in zip(samples, list(samples[1:]) + [None]):
        until = following.seconds if following is not None else end
        points.append((x(current.seconds), y(current.workers)))
        points.append((x(until), y(current.workers)))
    path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
    y_ticks = sorted({0, peak, peak // 2})
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="workers over time">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#f8f9fb" stroke="#ccd"/>',
    ]
    for tick in y_ticks:
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#e2e4ea"/>'
            f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" font-size="11" text-anchor="end">{tick}</text>'
        )
    for fraction in (0.0, 0.5, 1.0):
        parts.append(
            f'<text x="{x(last * fraction):.1f}" y="{height - 18}" font-size="11" '
            f'text-anchor="middle">{last * fraction:.1f}s</text>'
        )
    for seconds, label in marks:
        parts.append(
            f'<line x1="{x(seconds):.1f}" x2="{x(seconds):.1f}" y1="{top}" y2="{top + plot_h}" '
            'stroke="#c0392b" stroke-dasharray="4 3"/>'
            f'<text x="{x(seconds) - 4:.1f}" y="{top + 12}" font-size="11" text-anchor="end" '
            f'fill="#c0392b">{html.escape(label)}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" font-size="11" text-anchor="middle">'
        "seconds since start</text>"
        f'<text x="12" y="{top + plot_h / 2:.1f}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 12 {top + plot_h / 2:.1f})">workers</text>'
    )
    if points:
        parts.append(f'<polyline points="{path}" fill="none" stroke="#3b6fd8" stroke-width="2"/>')
    parts.append("</svg>")
    return "".join(parts)


def fact_text(value: object) -> str:
    """A fact as shown in a Deck: floats rounded to two decimals (``0.61``), the rest as ``str``."""
    if isinstance(value, float):
        return str(round(value, 2))
    return str(value)


def shown_facts(facts: Mapping[str, object], timeline: WorkerTimeline) -> Dict[str, object]:
    """``facts`` as a Deck shows them: no blank where the value is known. A worker tier nobody asked
    for is the tier the workers ran on; readiness never checked says why; the rest that is empty
    reads ``-`` (``ready_workers`` -1 reads "not observable")."""
    shown: Dict[str, object] = {}
    for key, value in facts.items():
        if key in ("worker_hw_tier", "worker tier") and value in ("", None):
            tier = timeline.last_tier()
            value = f"{tier} (the cluster's; none asked for)" if tier else "-"
        elif key == "readiness" and value in ("", None):
            value = "not checked (not waited for)" if facts.get("waited") is False else "not checked"
        elif key == "ready_workers" and value == -1:
            value = "not observable by this backend"
        elif value in ("", None):
            value = "-"
        shown[key] = value
    return shown


def render_html(title: str, timeline: WorkerTimeline, facts: Mapping[str, object]) -> str:
    """An HTML page: ``facts`` as a table (:func:`shown_facts`), the worker plot, and worker-seconds of
    every tier that had a worker up (``< 0.1`` when they round to 0.0); "no workers were up" when none was."""
    rows = "".join(
        f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td>{html.escape(fact_text(v))}</td></tr>"
        for k, v in shown_facts(facts, timeline).items()
    )
    totals = timeline.worker_seconds_by_tier()
    tiers = "".join(
        f"<tr><td>{html.escape(tier)}</td><td>{_worker_seconds(totals.get(tier, 0.0))}</td></tr>"
        for tier in timeline.tiers_used()
    ) or "<tr><td colspan='2'>no workers were up</td></tr>"
    return (
        f"<h2>{html.escape(title)}</h2>"
        f"<table>{rows}</table>"
        "<h3>Workers over time</h3>"
        f"{render_svg(timeline.samples, timeline.duration, marks=timeline.marks)}"
        "<h3>Worker-seconds by tier</h3>"
        f"<table><tr><th>tier</th><th>worker-seconds</th></tr>{tiers}</table>"
    )


def _worker_seconds(value: float) -> str:
    return f"{value:.1f}" if round(value, 1) > 0 else "&lt; 0.1"


def publish_deck(name: str, page: str) -> "Deck":
    """Attach ``page`` as Deck ``name`` to the current Flyte task, as its first tab (rendered with
    ``enable_deck=True``; harmless outside a task), and return the Deck."""
    from flytekit import Deck
    from flytekit.core.context_manager import FlyteContextManager

    deck = Deck(name, page, auto_add_to_deck=False)
    ctx = FlyteContextManager.current_context()
    params = ctx.user_space_params
    if _local_run(ctx):
        # A local run's tasks share the run's list of Decks: this task gets a list of its own.
        params._decks = [deck, *params.decks]
    else:
        params.decks.insert(0, deck)
    _list_local_decks_at_exit()
    return deck


def _local_run(ctx: "FlyteContext") -> bool:
    return ctx.execution_state is not None and bool(ctx.execution_state.is_local_execution())


DECK_FILE = "deck.html"
_TITLE = re.compile(r"<h2>([^<]{1,200})</h2>")
_listing: Optional[Path] = None


def _list_local_decks_at_exit() -> None:
    global _listing
    from flytekit.core.context_manager import FlyteContextManager

    ctx = FlyteContextManager.current_context()
    if _listing is not None or not _local_run(ctx):
        return
    _listing = Path(ctx.file_access.local_sandbox_dir)
    atexit.register(print_local_decks, _listing)


def local_decks(root: Path) -> List[Tuple[str, Path]]:
    """The ``deck.html`` files under ``root``, oldest first, each labelled with the titles of this
    plugin's Decks in it (each task's file holds its own only: :func:`publish_deck`); a task with
    only flytekit's Decks is labelled ``task Deck``."""
    found = []
    for path in sorted(root.glob(f"*/{DECK_FILE}"), key=lambda p: p.stat().st_mtime):
        titles = [html.unescape(t) for t in _TITLE.findall(path.read_text(encoding="utf-8", errors="replace"))]
        found.append((", ".join(titles) or "task Deck", path))
    return found


def print_local_decks(root: Path) -> None:
    """Print where this local run's Decks were written (nothing when none were)."""
    from .progress import emit_line

    decks = local_decks(root)
    if decks:
        emit_line("Decks of this run (open in a browser):\n" + "\n".join(
            f"  {title}: {path.as_uri()}" for title, path in decks
        ))
