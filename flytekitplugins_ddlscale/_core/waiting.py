"""Deadlines and adaptive polling shared by every wait: fast polls at first, then geometric back-off to a
cap, never past the deadline; a timeout is a :class:`ScalingTimeoutError` carrying the last state."""
import contextlib
import contextvars
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Protocol, Tuple, TypeVar

from ..errors import ScalingTimeoutError
from ..models import ClusterState
from .progress import ProgressReporter, WaitProgress, seconds

T = TypeVar("T")
MIN_WAIT = 0.1
"""Seconds a wait still gets when the earlier steps of its operation took (nearly) all of its timeout,
so it reads the cluster at least once."""

MIN_STATE_READ = 1.0
"""Seconds the read of a cluster's state at the end of an operation still gets when the operation's
deadline is (nearly) spent: a request needs longer than :data:`MIN_WAIT` to be answered."""

PROBE_GRACE = 0.5
"""Seconds one probe of a framework (a connection to a scheduler, a head's HTTP status) still gets
once its operation's deadline (:func:`within`) is spent: the clean-up and the final state read after a
timeout make one or two, so an operation ends within about a second of its timeout."""

CLEANUP_GRACE = 5.0
"""Seconds the clean-up after a timed-out operation gets of its own (a phase giving back what it set, a change
dropping the workers that died): its lock, process stops, head checks and wait are cut to it, so an operation
ends within about this much of its timeout, whatever hangs."""

logger = logging.getLogger("flytekitplugins_ddlscale")
_OPERATION: "contextvars.ContextVar[Optional[Tuple[Deadline, Optional[float]]]]" = contextvars.ContextVar(
    "ddlscale_operation", default=None
)
"""The deadline of the operation under way in this context, and its step cap (:func:`within`)."""


class Deadline:
    """A point in monotonic time that a wait must not pass."""

    transient_at_end = False
    """Whether reaching it inside an outage (a restarted server's 401/403s included) is transient: the
    caller reads again later (:class:`ReadBudget`), rather than the refusal being its answer."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.started = time.monotonic()
        self.expires = self.started + timeout

    @property
    def elapsed(self) -> float:
        """Seconds since the deadline was set."""
        return time.monotonic() - self.started

    @property
    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.expires - time.monotonic())

    @property
    def expired(self) -> bool:
        """True once the deadline has passed."""
        return time.monotonic() >= self.expires

    def left_for_wait(self) -> float:
        """The timeout of a wait that ends an operation under this deadline: the time left,
        at least :data:`MIN_WAIT`."""
        return max(self.remaining, MIN_WAIT)

    def left_for_state_read(self) -> float:
        """The timeout of the state read that ends an operation under this deadline: the time left,
        at least :data:`MIN_STATE_READ`."""
        return max(self.remaining, MIN_STATE_READ)


class ReadBudget(Deadline):
    """The budget of one read by a poller that answers at it anyway (the connector's call budget): an
    outage, or a restarted server's 401/403 while its authorization warms up, that lasts until it ends
    the read as transient, and the poller reads again at its next call."""

    transient_at_end = True


@contextlib.contextmanager
def within(deadline: "Deadline", step: Optional[float] = None) -> Iterator[None]:
    """Every :func:`probe_timeout` in this thread inside the block is cut to what is left of ``deadline``
    (of the tightest, when blocks nest), and with ``step`` (a clean-up's :data:`PROBE_GRACE`) to at most
    that many seconds each: a clean-up checking a hung head several times must not spend its grace on one."""
    outer = _OPERATION.get()
    tighter = deadline if outer is None or deadline.expires <= outer[0].expires else outer[0]
    steps = [cap for cap in (step, outer[1] if outer is not None else None) if cap is not None]
    token = _OPERATION.set((tighter, min(steps) if steps else None))
    try:
        yield
    finally:
        _OPERATION.reset(token)


def probe_timeout(default: float, what: str = "a probe") -> float:
    """The timeout of one step (``what``: a check of a head, a retirement, the wait after a SIGTERM):
    ``default``, cut to the operation's step cap and to what is left of its deadline (:func:`within`),
    at least :data:`PROBE_GRACE` once it is spent; ``default`` outside any operation."""
    current = _OPERATION.get()
    if current is None:
        return default
    operation, step = current
    limit = default if step is None else min(default, step)
    cut = limit if operation.remaining >= limit else max(operation.remaining, PROBE_GRACE)
    if cut < default:
        logger.debug("%s gets %.2f s: what is left of the operation's timeout of %s%s", what, cut,
                     seconds(operation.timeout), "" if step is None else f" (at most {seconds(step)} a step)")
    return cut


@dataclass(frozen=True)
class Backoff:
    """Geometric poll intervals: ``initial``, ``initial*factor``, ... capped at ``cap``; with ``jitter``
    (0 to 1) each is drawn from ``[step * (1 - jitter), step]``, so clients do not all come back at once."""

    initial: float = 0.25
    factor: float = 1.5
    cap: float = 2.0
    jitter: float = 0.0

    def intervals(self) -> Iterator[float]:
        """An endless iterator of sleep intervals in seconds."""
        delay = self.initial
        while True:
            yield delay * (1.0 - self.jitter * random.random()) if self.jitter else delay
            delay = min(self.cap, delay * self.factor)


class PollSchedule(Protocol):
    """Anything that yields sleep intervals between polls."""

    def intervals(self) -> Iterator[float]:
        """An endless iterator of sleep intervals in seconds."""
        ...


@dataclass(frozen=True)
class TwoStageBackoff:
    """``initial`` doubling up to ``fast``, held until ``fast_until`` seconds of sleeping, then ``slow``: for
    services without a watch, quick changes are seen quickly and a long wait polls less often."""

    initial: float = 0.25
    fast: float = 1.0
    fast_until: float = 10.0
    slow: float = 3.0

    def intervals(self) -> Iterator[float]:
        """An endless iterator of sleep intervals in seconds."""
        slept = 0.0
        delay = self.initial
        while True:
            step = delay if slept < self.fast_until else self.slow
            yield step
            slept += step
            delay = min(self.fast, delay * 2.0)


def poll(read: Callable[[], T], done: Callable[[T], bool], *, deadline: Deadline, schedule: PollSchedule,
         timed_out: Callable[[T], Exception], sleep: Callable[[float], None] = time.sleep) -> T:
    """The first ``read()`` that is ``done``, read ``schedule`` apart, never sleeping past ``deadline``;
    once it has passed, raises ``timed_out(last read)``. The one loop of every wait that polls."""
    intervals = schedule.intervals()
    while True:
        value = read()
        if done(value):
            return value
        if deadline.expired:
            raise timed_out(value)
        sleep(min(next(intervals), deadline.remaining))


@dataclass(frozen=True)
class Awaited:
    """What a wait for a cluster polls for: ``what`` in words (progress and the timeout error), the
    ``target`` count, how a state ``count``s towards it, and when a state is ``done``."""

    what: str
    target: int
    count: Callable[[ClusterState], int]
    done: Callable[[ClusterState], bool]


def _no_note(deadline: "Deadline") -> str:
    return ""


@dataclass(frozen=True)
class Pacing:
    """How a wait polls: its schedule, how it sleeps, and what its timeout error adds (``note(deadline)``,
    e.g. how long the backend was unreachable)."""

    backoff: PollSchedule = Backoff()
    sleep: Callable[[float], None] = time.sleep
    note: Callable[["Deadline"], str] = _no_note


def poll_until(
    read: Callable[[], ClusterState],
    awaited: Awaited,
    timeout: float,
    progress: Optional[ProgressReporter] = None,
    pacing: Pacing = Pacing(),
) -> ClusterState:
    """The first state ``read`` returns that is ``awaited.done``, reported to ``progress`` as it goes;
    :class:`ScalingTimeoutError` with the last state once ``timeout`` passes."""
    deadline = Deadline(timeout)
    what = awaited.what

    def finished(state: ClusterState) -> bool:
        if progress is not None:
            progress(WaitProgress(what, awaited.count(state), awaited.target, deadline.elapsed, timeout, state.describe()))
        return awaited.done(state)

    def timed_out(state: ClusterState) -> ScalingTimeoutError:
        extra = pacing.note(deadline)
        return ScalingTimeoutError(
            f"timed out after {seconds(timeout)} waiting for {what}; {extra + '; ' if extra else ''}"
            f"last state: {state.describe()}",
            cluster=state.cluster,
            state=state,
        )

    return poll(read, finished, deadline=deadline, schedule=pacing.backoff, timed_out=timed_out, sleep=pacing.sleep)
