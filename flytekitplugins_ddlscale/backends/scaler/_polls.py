"""Scaler-service polls shared by every wait in this process, and paced so the service sees a bounded rate.

Per service URL a :class:`PollPacer` (a 429/503 pauses every waiter and halves the rate), and per identity
:class:`SharedPolls` (waits on one cluster, or :data:`LIST_FROM` of a kind, share one read): docs/scaler.md,
"Many waits in one process". Writes are never paced or shared.
"""
import threading
import time
import weakref
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar

from ..._core import settings
from ...errors import BackendUnavailableError, TransientError
from ..._core.waiting import Deadline

T = TypeVar("T")

DEFAULT_MAX_RPS = settings.SCALER_MAX_RPS.default
"""Polls per second this process sends to one scaler service when nothing else is configured."""
MIN_PAUSE, MAX_PAUSE = 0.5, 2.0
"""Bounds (seconds) of the pause every waiter takes after a 429/503 without ``Retry-After`` (the
same cap as :data:`~flytekitplugins_ddlscale._core.outage.OUTAGE_BACKOFF`)."""
MAX_RETRY_AFTER = 10.0
"""Longest ``Retry-After`` honoured (seconds), so a wrong header cannot stall every wait."""
MIN_RATE = 1.0
LIST_FROM = 3
"""Clusters of one kind waited on at once from which one list answers all their polls."""
INTEREST_S = 5.0
"""Seconds a wait's last read counts it as waiting on its cluster."""
KEEP_RESULTS = 4096
"""Cluster results kept per service before the oldest are forgotten."""


def max_rps_from(value: Optional[float], env: Optional[Dict[str, str]] = None) -> float:
    """``value``, else ``$DDLSCALE_SCALER_MAX_RPS``, else :data:`DEFAULT_MAX_RPS`; a positive number or
    :class:`InvalidInputError` naming the setting."""
    return settings.SCALER_MAX_RPS.value(value, env, field="max_requests_per_second")


class PollPacer:
    """Slots for polls to one service: at most ``rate`` per second, everyone paused after a 429/503."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.limit = rate
        self.rate = rate
        self._next = clock()
        self._paused_until = 0.0
        self._pause = MIN_PAUSE
        self.slowdowns = 0
        """429/503 answers seen."""

    def set_limit(self, rate: float) -> None:
        """Change the configured rate (the latest backend created for this service sets it)."""
        with self._lock:
            self.limit = rate
            self.rate = min(self.rate, rate) if self.slowdowns else rate

    def slot(self, deadline: Optional[Deadline]) -> float:
        """Reserve the next slot; return the seconds to sleep before using it (never past ``deadline``)."""
        with self._lock:
            now = self._clock()
            start = max(now, self._next, self._paused_until)
            self._next = start + 1.0 / self.rate
        wait = start - now
        return min(wait, deadline.remaining) if deadline is not None else wait

    def held(self, deadline: Optional[Deadline]) -> float:
        """Seconds of a pause still running (a slot reserved before a 429/503 waits it out too)."""
        with self._lock:
            wait = max(0.0, self._paused_until - self._clock())
        return min(wait, deadline.remaining) if deadline is not None else wait

    def slowed(self, retry_after: Optional[float]) -> None:
        """The service answered 429/503: pause every poller and halve the rate."""
        with self._lock:
            self.slowdowns += 1
            pause = retry_after if retry_after is not None and retry_after > 0 else self._pause
            self._pause = min(MAX_PAUSE, self._pause * 2)
            self._paused_until = max(self._paused_until, self._clock() + min(pause, MAX_RETRY_AFTER))
            self.rate = max(MIN_RATE, self.rate / 2)

    def answered(self) -> None:
        """An answer that was not 429/503: the rate climbs back towards the limit."""
        with self._lock:
            self._pause = MIN_PAUSE
            if self.rate < self.limit:
                self.rate = min(self.limit, self.rate * 1.25)


class _Flight:
    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.begun = time.time()
        """Wall-clock time the fetch began (what a reader's ``not_before`` is compared with)."""
        self.done = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None


class SharedPolls:
    """One poll at a time per cluster, its result shared with every wait on that cluster."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: Dict[str, Tuple[float, float, Any]] = {}
        """key -> (monotonic time the fetch ended, wall-clock time it began, its result)."""
        self._flights: Dict[str, _Flight] = {}
        self._generation = 0
        self._interest: Dict[str, Dict[str, float]] = {}

    def read(
        self, key: str, fetch: Callable[[], T], max_age: float, deadline: Optional[Deadline],
        not_before: Optional[float] = None,
    ) -> T:
        """``fetch()``'s result for ``key``, or one at most ``max_age`` s old, or that of a fetch in flight;
        with ``not_before`` (epoch seconds), only a fetch begun then or later (a change sent at
        ``not_before``, perhaps by another process, shows in no read begun before).

        A joined fetch's outage error is not inherited: the caller fetches again itself while its own
        ``deadline`` allows (its deadline may be longer than the fetcher's); other errors are shared."""
        while True:
            with self._lock:
                cached = self._results.get(key)
                if cached is not None and time.monotonic() - cached[0] <= max_age and _after(cached[1], not_before):
                    return cached[2]
                flight = self._flights.get(key)
                leader = flight is None
                if leader:
                    flight = self._flights[key] = _Flight(self._generation)
            assert flight is not None
            if leader:
                return self._fetch(key, flight, fetch)
            if not flight.done.wait(deadline.remaining if deadline is not None else None):
                raise BackendUnavailableError(f"no answer for {key} before the deadline (a shared poll is still waiting)")
            if not _after(flight.begun, not_before):
                continue  # begun before the change: this reader fetches after it
            if flight.error is None:
                return flight.result
            if not isinstance(flight.error, TransientError) or (deadline is not None and deadline.expired):
                raise flight.error

    def cached(self, key: str, max_age: float, not_before: Optional[float] = None) -> Any:
        """The result :meth:`read` would reuse for ``key`` at once (nothing fetched, no wait), or None."""
        with self._lock:
            cached = self._results.get(key)
            if cached is not None and time.monotonic() - cached[0] <= max_age and _after(cached[1], not_before):
                return cached[2]
        return None

    def forget(self, *keys: str) -> None:
        """Drop the results kept for ``keys``, and those of polls in flight now (this process just changed
        that cluster: a read sent before the change must not answer a wait after it)."""
        with self._lock:
            for key in keys:
                self._results.pop(key, None)
            self._generation += 1

    def crowd(self, group: str, member: str) -> int:
        """Note that ``member`` (a cluster) of ``group`` (its kind) is being waited on; return how many
        members of the group were in the last :data:`INTEREST_S` seconds."""
        now = time.monotonic()
        with self._lock:
            members = self._interest.setdefault(group, {})
            members[member] = now
            if len(members) > 1 and min(members.values()) < now - INTEREST_S:
                for name in [m for m, seen in members.items() if seen < now - INTEREST_S]:
                    del members[name]
            return len(members)

    def _fetch(self, key: str, flight: _Flight, fetch: Callable[[], T]) -> T:
        try:
            flight.result = fetch()
            return flight.result
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._flights[key]
                if flight.error is None and flight.generation == self._generation:
                    self._results[key] = (time.monotonic(), flight.begun, flight.result)
                    if len(self._results) > KEEP_RESULTS:
                        oldest = min(self._results, key=lambda k: self._results[k][0])
                        del self._results[oldest]
            flight.done.set()


def _after(begun: float, not_before: Optional[float]) -> bool:
    """Whether a fetch begun at ``begun`` (epoch seconds) may answer a reader asking for ``not_before``."""
    return not_before is None or begun >= not_before


# Held by the clients that use them: gone with the last client, so a later service at the same
# address starts with a fresh pace and no results of the one before.
_PACERS: "weakref.WeakValueDictionary[str, PollPacer]" = weakref.WeakValueDictionary()
_POLLS: "weakref.WeakValueDictionary[Tuple[str, str], SharedPolls]" = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def pacer_for(url: str, rate: float) -> PollPacer:
    """The pacer of the service at ``url`` in this process; ``rate`` becomes its limit."""
    with _LOCK:
        pacer = _PACERS.get(url)
        if pacer is None:
            pacer = _PACERS[url] = PollPacer(rate)
        else:
            pacer.set_limit(rate)
        return pacer


def polls_for(url: str, identity: str) -> SharedPolls:
    """The shared polls of the service at ``url`` for callers authenticated as ``identity`` (a digest)."""
    with _LOCK:
        polls = _POLLS.get((url, identity))
        if polls is None:
            polls = _POLLS[(url, identity)] = SharedPolls()
        return polls
