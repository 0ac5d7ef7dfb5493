"""Progress of long waits: a rich live line in a local terminal, log lines elsewhere.

Backends call a :class:`ProgressReporter` while they wait; callers choose
where it goes. :func:`default_reporter` picks rich when stderr is a terminal
(local ``pyflyte run``) and rate-limited logging otherwise (remote pods).
"""
import logging
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

logger = logging.getLogger("flytekitplugins_ddlscale")


@dataclass(frozen=True)
class WaitProgress:
    """One progress report from a wait."""

    what: str
    """What is being waited for, e.g. ``3 Ready workers on ray/my-cluster``."""
    current: int
    """How many of ``target`` are there now."""
    target: int
    elapsed: float
    """Seconds since the wait began."""
    timeout: float
    detail: str = ""
    """The last observed state, in words."""


ProgressReporter = Callable[[WaitProgress], None]


class LogReporter:
    """Logs progress at INFO when it changes, and at most every ``interval`` seconds otherwise."""

    def __init__(self, interval: float = 10.0, log: logging.Logger = logger) -> None:
        self._interval = interval
        self._log = log
        self._last_key: Optional[tuple] = None
        self._last_time = 0.0

    def __call__(self, progress: WaitProgress) -> None:
        key = (progress.what, progress.current, progress.target, progress.detail)
        now = time.monotonic()
        if key == self._last_key and now - self._last_time < self._interval:
            return
        self._last_key, self._last_time = key, now
        self._log.info(
            "waiting for %s: %d/%d after %.1fs (timeout %.0fs) %s",
            progress.what,
            progress.current,
            progress.target,
            progress.elapsed,
            progress.timeout,
            progress.detail,
        )


class RichReporter:
    """Draws one live progress bar per wait on the rich console (stderr)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Column

        # Numbers first: on a narrow terminal rich truncates the last columns,
        # and the count matters more than the wording.
        self._progress = Progress(
            BarColumn(bar_width=20),
            TextColumn("{task.fields[current]}/{task.fields[target]}"),
            TimeElapsedColumn(),
            TextColumn(
                "[bold]{task.description}",
                table_column=Column(no_wrap=True, overflow="ellipsis", max_width=44),
            ),
            console=Console(stderr=True),
            transient=False,
        )
        self._tasks: dict = {}

    def __call__(self, progress: WaitProgress) -> None:
        done = progress.current == progress.target
        total = max(progress.target, 1)
        if not self._tasks:
            self._progress.start()
        task_id = self._tasks.get(progress.what)
        if task_id is None:
            task_id = self._progress.add_task(
                progress.what, total=total, current=progress.current, target=progress.target
            )
            self._tasks[progress.what] = task_id
        self._progress.update(
            task_id,
            completed=total if done else progress.current,
            total=total,
            current=progress.current,
            target=progress.target,
        )
        if done:
            self._progress.stop_task(task_id)
            del self._tasks[progress.what]
            if not self._tasks:
                self._progress.stop()


def default_reporter() -> ProgressReporter:
    """Rich progress on an interactive terminal, logging otherwise."""
    if sys.stderr.isatty():
        return RichReporter()
    return LogReporter()
