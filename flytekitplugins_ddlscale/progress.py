"""What a user sees while the plugin works: live progress of waits, and one summary line per step.

Backends call a :class:`ProgressReporter` while they wait; callers choose
where it goes. :func:`default_reporter` picks a rich progress bar when
stderr is a terminal (local ``pyflyte run``) and rate-limited logging
otherwise (remote pods). :func:`emit_summary` prints the one line each node
and phase ends with (quiet with ``DDLSCALE_QUIET=1``).
"""
import logging
import os
import sys
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Callable, Optional, Type, Union

from .wording import plural

logger = logging.getLogger("flytekitplugins_ddlscale")

QUIET_ENV = "DDLSCALE_QUIET"
"""Set to 1 (or true/yes) to silence summary lines."""


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


@dataclass(frozen=True)
class Activity:
    """Who waits for what: the node or phase, the full cluster name, and the goal in words."""

    step: str
    """The node or phase name, e.g. ``scale_up``."""
    cluster: str
    goal: str = "waiting for {workers}"
    """Formatted with ``target`` (a number) and ``workers`` (``1 worker``, ``2 workers``): what the wait needs."""

    def describe(self, target: int) -> str:
        """``scale_up dask/x: waiting for 2 workers``."""
        return f"{self.step} {self.cluster}: {self.goal.format(target=target, workers=plural(target, 'worker'))}"


class LogReporter:
    """Logs progress at INFO when it changes, and at most every ``interval`` seconds otherwise."""

    def __init__(
        self, interval: float = 10.0, log: logging.Logger = logger, activity: Optional[Activity] = None
    ) -> None:
        self._interval = interval
        self._log = log
        self._activity = activity
        self._last_key: Optional[tuple] = None
        self._last_time = 0.0

    def begin(self, target: int, timeout: float) -> None:
        """Log that the wait starts."""
        if self._activity is not None:
            self._log.info("%s (timeout %.0fs)", self._activity.describe(target), timeout)

    def __call__(self, progress: WaitProgress) -> None:
        key = (progress.what, progress.current, progress.target, progress.detail)
        now = time.monotonic()
        if key == self._last_key and now - self._last_time < self._interval:
            return
        self._last_key, self._last_time = key, now
        prefix = f"{self._activity.step}: " if self._activity is not None else ""
        self._log.info(
            "%swaiting for %s: %d/%d after %.1fs (timeout %.0fs) %s",
            prefix,
            progress.what,
            progress.current,
            progress.target,
            progress.elapsed,
            progress.timeout,
            progress.detail,
        )

    def __enter__(self) -> "LogReporter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


class RichReporter:
    """One live progress bar per wait on the rich console (stderr).

    With an :class:`Activity` the bar appears as soon as :meth:`begin` is
    called, reads ``scale_up dask/x: waiting for 2 workers`` and wraps
    rather than truncating on a narrow terminal. Used as a context manager
    it ends the live display on exit, so an error that follows starts on a
    line of its own.
    """

    def __init__(self, activity: Optional[Activity] = None, console: Optional[object] = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Column

        self._activity = activity
        # Numbers first and the words last, folded onto a second line when
        # the terminal is narrow: 80 columns keep the count, the time and
        # the full cluster name readable.
        self._progress = Progress(
            BarColumn(bar_width=16),
            TextColumn("{task.fields[current]}/{task.fields[target]}"),
            TimeElapsedColumn(),
            TextColumn(
                "{task.description}",
                table_column=Column(no_wrap=False, overflow="fold", ratio=1),
            ),
            console=console if console is not None else Console(stderr=True),
            transient=False,
            expand=True,
        )
        self._tasks: dict = {}
        self._started = False

    def _key(self, progress_what: str) -> str:
        return self._activity.step if self._activity is not None else progress_what

    def _describe(self, what: str, target: int) -> str:
        return self._activity.describe(target) if self._activity is not None else f"waiting for {what}"

    def _ensure(self, key: str, description: str, current: int, target: int) -> int:
        if not self._started:
            self._progress.start()
            self._started = True
        task_id = self._tasks.get(key)
        if task_id is None:
            task_id = self._progress.add_task(
                description, total=max(target, 1), current=current, target=target
            )
            self._tasks[key] = task_id
        return task_id

    def begin(self, target: int, timeout: float) -> None:
        """Show the bar now, before the first observation."""
        if self._activity is None:
            return
        self._ensure(self._activity.step, self._activity.describe(target), 0, target)

    def __call__(self, progress: WaitProgress) -> None:
        done = progress.current >= progress.target
        total = max(progress.target, 1)
        key = self._key(progress.what)
        task_id = self._ensure(key, self._describe(progress.what, progress.target), progress.current, progress.target)
        self._progress.update(
            task_id,
            description=self._describe(progress.what, progress.target),
            completed=total if done else progress.current,
            total=total,
            current=progress.current,
            target=progress.target,
        )
        if done:
            self._progress.stop_task(task_id)
            del self._tasks[key]
            if not self._tasks:
                self.close()

    def close(self) -> None:
        """End the live display (idempotent); the cursor ends on a fresh line."""
        if self._started:
            self._progress.stop()
            self._started = False
            self._tasks.clear()

    def __enter__(self) -> "RichReporter":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()


WaitReporter = Union[LogReporter, RichReporter]
"""A :data:`ProgressReporter` that can also announce a wait (``begin``) and be used with ``with``."""


def default_reporter(activity: Optional[Activity] = None) -> WaitReporter:
    """Rich progress on an interactive terminal, logging otherwise.

    The returned reporter is also a context manager (leave the live display
    on exit) and has ``begin(target, timeout)`` (show the wait before the
    first observation); see :func:`begin_wait`.
    """
    if sys.stderr.isatty():
        return RichReporter(activity)
    return LogReporter(activity=activity)


def begin_wait(reporter: Optional[ProgressReporter], target: int, timeout: float) -> None:
    """Tell ``reporter`` a wait for ``target`` starts, if it can show that (rich bar, log line)."""
    begin = getattr(reporter, "begin", None)
    if begin is not None:
        begin(target, timeout)


def quiet() -> bool:
    """True when ``$DDLSCALE_QUIET`` asks for no summary lines."""
    return os.environ.get(QUIET_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def emit_summary(line: str) -> None:
    """Print a node's or phase's one-line summary, unless ``$DDLSCALE_QUIET`` is set.

    When the program has configured logging (a handler on this plugin's
    logger or an ancestor), the line goes through the
    ``flytekitplugins_ddlscale`` logger at INFO, so the user's
    configuration decides. Otherwise (flytekit configures only its own
    logger, so this is the case under ``pyflyte run`` and in task pods) it
    is written straight to stderr.
    """
    if quiet():
        return
    if logger.hasHandlers():
        logger.info("%s", line)
        return
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
