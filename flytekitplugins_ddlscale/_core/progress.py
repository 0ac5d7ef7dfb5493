"""What a user sees while the plugin works: live progress of waits (:func:`default_reporter`: a rich bar on a
terminal, rate-limited log lines elsewhere), the lines :func:`emit_line` prints (none with ``DDLSCALE_QUIET=1``),
and the words they share for counts and durations (:func:`plural`, :func:`seconds`)."""
import logging
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Set, Tuple, Union

from . import settings
from .lifetime import Closing, at_exit_once

logger = logging.getLogger("flytekitplugins_ddlscale")


def plural(count: int, noun: str, many: Optional[str] = None) -> str:
    """``count`` and ``noun``, pluralised by adding "s" (or as ``many``): ``1 worker``, ``2 workers``,
    ``0 workers``; ``plural(2, "process", "processes")``."""
    return f"{count} {noun}" if count == 1 else f"{count} {many or noun + 's'}"


def seconds(value: float) -> str:
    """A duration as people read it in messages: ``900s``, ``4.9s``, ``0.5s`` (never ``0s`` for half a second)."""
    return f"{round(value, 1):g}s"


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

    def ended(self, current: int, target: int, reached: bool) -> str:
        """How the wait ended: ``scale_up dask/x: done, 2 workers up``, or when it ended short (an
        error, a timeout, Ctrl-C) ``scale_up dask/x: stopped waiting, 1 of 2 workers up``."""
        return f"{self.step} {self.cluster}: {_ending(current, target, reached)}"


def _ending(current: int, target: int, reached: bool) -> str:
    if reached:
        return f"done, {plural(current, 'worker')} up"
    return f"stopped waiting, {current} of {plural(target, 'worker')} up"


HEARTBEAT_SECONDS = 15.0
"""Longest silence of a wait that is not on a terminal: a line at least this often while nothing changes."""


class LogReporter(Closing):
    """Lines for a wait off a terminal (a pipe, a pod's log): one when it starts, one on every change, and a
    heartbeat at least every ``interval`` seconds while nothing changes (:func:`emit_line`). The heartbeat's
    thread ends with the wait, its timeout, :meth:`close`, or the last reference to the reporter."""

    def __init__(self, interval: float = HEARTBEAT_SECONDS, activity: Optional[Activity] = None) -> None:
        self._interval = interval
        self._activity = activity
        self._lock = threading.Lock()
        self._last_key: Optional[tuple] = None
        self._last: Optional[WaitProgress] = None
        self._last_at = 0.0
        """When ``_last`` arrived (monotonic)."""
        self._last_line_at = 0.0
        self._began_at: Optional[float] = None
        self._timeout: Optional[float] = None
        self._target: Optional[int] = None
        self._closed = False
        self._stopped = threading.Event()
        """Set when the current wait is done or the reporter is closed; a later wait gets a new one."""
        self._heartbeat: Optional[threading.Thread] = None

    def begin(self, target: int, timeout: float) -> None:
        """Print that the wait starts, and start the heartbeat."""
        with self._lock:
            self._began_at, self._timeout, self._target = time.monotonic(), timeout, target
            self._last = None
            self._start_heartbeat()
        if self._activity is not None:
            self._say(f"{self._activity.describe(target)} (timeout {timeout:.0f}s)")

    def __call__(self, progress: WaitProgress) -> None:
        key = (progress.what, progress.current, progress.target, progress.detail)
        with self._lock:
            now = time.monotonic()
            self._target, self._last, self._last_at = progress.target, progress, now
            if progress.current >= progress.target:
                self._stopped.set()
            else:
                self._start_heartbeat()
            if key == self._last_key and now - self._last_line_at < self._interval:
                return
            self._last_key, self._last_line_at = key, now
        emit_line(self._line(progress, progress.elapsed, still=False))

    def _line(self, progress: WaitProgress, elapsed: float, still: bool) -> str:
        prefix = f"{self._activity.step}: " if self._activity is not None else ""
        verb = "still waiting" if still else "waiting"
        detail = f" {progress.detail}" if progress.detail else ""
        return (
            f"{prefix}{verb} for {progress.what}: {progress.current}/{progress.target} after {elapsed:.1f}s "
            f"(timeout {progress.timeout:.0f}s){detail}"
        )

    def _say(self, line: str) -> None:
        with self._lock:
            self._last_line_at = time.monotonic()
        emit_line(line)

    def _beat(self) -> Optional[float]:
        """Print a heartbeat if the wait was silent for ``interval``; seconds until the next check, or None to end."""
        with self._lock:
            now = time.monotonic()
            if self._last is not None:
                elapsed, timeout = self._last.elapsed + (now - self._last_at), self._last.timeout
            elif self._began_at is not None and self._timeout is not None:
                elapsed, timeout = now - self._began_at, self._timeout
            else:
                return None
            if self._stopped.is_set() or elapsed > timeout + self._interval:
                return None
            silent = now - self._last_line_at
            if silent < self._interval:
                return self._interval - silent
            if self._last is not None:
                line = self._line(self._last, elapsed, still=True)
            else:
                step = f"{self._activity.describe(self._target or 0)}" if self._activity else "waiting"
                line = f"{step}: still waiting after {elapsed:.1f}s (timeout {timeout:.0f}s)"
            self._last_line_at = now
        emit_line(line)
        return self._interval

    def _start_heartbeat(self) -> None:
        """Start the heartbeat of the current wait unless it runs (called under the lock)."""
        if self._closed or quiet() or (self._heartbeat is not None and not self._stopped.is_set()):
            return
        at_exit_once(_end_heartbeats)
        self._stopped = threading.Event()
        self._last_line_at = time.monotonic()
        self._heartbeat = threading.Thread(
            target=_heartbeat, args=(weakref.ref(self), self._stopped), name="ddlscale-progress", daemon=True
        )
        self._heartbeat.start()

    def close(self) -> None:
        """End the heartbeat for good (idempotent)."""
        with self._lock:
            self._closed = True
            self._stopped.set()


_RUNNING_HEARTBEATS: Set[Tuple[threading.Event, threading.Thread]] = set()
"""Heartbeats still running, ended before the interpreter exits (see :func:`_end_heartbeats`)."""


def _heartbeat(reporter_ref: "weakref.ReferenceType[LogReporter]", stopped: threading.Event) -> None:
    """Run a reporter's heartbeat; it holds the reporter weakly, so a wait that is forgotten ends it."""
    entry = (stopped, threading.current_thread())
    _RUNNING_HEARTBEATS.add(entry)
    try:
        delay: Optional[float] = 0.0
        while delay is not None and not stopped.wait(delay):
            reporter = reporter_ref()
            if reporter is None:
                return
            delay = reporter._beat()
            del reporter
    finally:
        _RUNNING_HEARTBEATS.discard(entry)


def _end_heartbeats() -> None:
    # A daemon thread still writing to stderr while the interpreter shuts down aborts the process
    # (SIGABRT: stderr's lock cannot be taken at shutdown): end every heartbeat first.
    for stopped, thread in list(_RUNNING_HEARTBEATS):
        stopped.set()
        thread.join(timeout=2.0)


class RichReporter(Closing):
    """One live progress bar per wait on the rich console (stderr), shown from :meth:`begin` with an
    :class:`Activity`; a finished bar says how the wait ended (``done, 2 workers up``, or ``stopped waiting,
    1 of 2 workers up`` when closed first). Closing ends the live display, so an error starts on its own line."""

    def __init__(self, activity: Optional[Activity] = None, console: Optional[object] = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Column

        self._activity = activity
        # Numbers first, words last and folded: 80 columns keep the count, the time and the cluster readable.
        self._progress = Progress(
            BarColumn(bar_width=16),
            TextColumn("{task.fields[current]}/{task.fields[target]}"),
            TimeElapsedColumn(),
            TextColumn("{task.description}", table_column=Column(no_wrap=False, overflow="fold", ratio=1)),
            console=console if console is not None else Console(stderr=True), transient=False, expand=True,
        )
        self._tasks: Dict[str, int] = {}
        self._last: Dict[str, WaitProgress] = {}
        """The latest report of each open bar, to say where it stopped if it never finishes."""
        self._started = False

    def _key(self, progress_what: str) -> str:
        return self._activity.step if self._activity is not None else progress_what

    def _describe(self, what: str, target: int) -> str:
        return self._activity.describe(target) if self._activity is not None else f"waiting for {what}"

    def _ended(self, progress: WaitProgress, reached: bool) -> str:
        if self._activity is not None:
            return self._activity.ended(progress.current, progress.target, reached)
        return f"{progress.what}: {_ending(progress.current, progress.target, reached)}"

    def _ensure(self, key: str, description: str, current: int, target: int) -> int:
        if not self._started:
            self._progress.start()
            self._started = True
        task_id = self._tasks.get(key)
        if task_id is None:
            task_id = self._progress.add_task(description, total=max(target, 1), current=current, target=target)
            self._tasks[key] = task_id
        return task_id

    def begin(self, target: int, timeout: float) -> None:
        """Show the bar now, before the first observation."""
        if self._activity is None:
            return
        self._ensure(self._activity.step, self._activity.describe(target), 0, target)
        self._last.setdefault(self._activity.step, WaitProgress(self._activity.step, 0, target, 0.0, timeout))

    def __call__(self, progress: WaitProgress) -> None:
        done = progress.current >= progress.target
        total = max(progress.target, 1)
        key = self._key(progress.what)
        task_id = self._ensure(key, self._describe(progress.what, progress.target), progress.current, progress.target)
        self._last[key] = progress
        self._progress.update(
            task_id,
            description=self._ended(progress, True) if done else self._describe(progress.what, progress.target),
            completed=total if done else progress.current,
            total=total,
            current=progress.current,
            target=progress.target,
        )
        if done:
            self._progress.stop_task(task_id)
            del self._tasks[key]
            del self._last[key]
            if not self._tasks:
                self.close()

    def close(self) -> None:
        """End the live display (idempotent); a bar still open says where its wait stopped, and the
        cursor ends on a fresh line."""
        if self._started:
            for key, task_id in self._tasks.items():
                last = self._last.get(key)
                if last is not None:
                    self._progress.update(task_id, description=self._ended(last, False))
                self._progress.stop_task(task_id)
            self._progress.stop()
            self._started = False
            self._tasks.clear()
            self._last.clear()


WaitReporter = Union[LogReporter, RichReporter]
"""A :data:`ProgressReporter` that can also announce a wait (``begin``) and be used with ``with``."""


def default_reporter(activity: Optional[Activity] = None) -> WaitReporter:
    """Rich progress on an interactive terminal, logging otherwise; closed by ``with``, and
    ``begin(target, timeout)`` shows a wait before its first observation (:func:`begin_wait`)."""
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
    return bool(settings.QUIET.value())


def emit_line(line: str) -> None:
    """Print one line for a user (a node's or phase's summary, a wait's progress) unless
    ``$DDLSCALE_QUIET`` is set: through the plugin's logger at INFO where the program configured
    logging for it, else straight to stderr (flytekit configures only its own logger)."""
    if quiet():
        return
    if logger.hasHandlers():
        logger.info("%s", line)
        return
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
