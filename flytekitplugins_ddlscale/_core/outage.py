"""Riding out a backend outage: one retry loop (:func:`send`) and one classifier for both HTTP stacks.

A request is sent again as its :class:`RetryRule` says; an :class:`OutageTracker` per backend logs once when
an outage starts and once when it ends, and tells a timeout how long the backend was unreachable. A backend
never reached (:class:`~flytekitplugins_ddlscale.errors.NeverReachedError`) and a 401/403 that follows no
outage fail at once. docs/kubernetes.md and docs/scaler.md, Outages.
"""
import http.client
import logging
import random
import ssl
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Iterator, Optional, Tuple, TypeVar

# NeverReachedError is defined with the other public errors and still importable from here.
from ..errors import BackendUnavailableError, NeverReachedError, ScalingTimeoutError, TransientError, UnauthorizedError
from ..models import ClusterState
from . import settings
from .waiting import Backoff, Deadline

T = TypeVar("T")

OUTAGE_BACKOFF = Backoff(initial=0.2, factor=2.0, cap=2.0, jitter=0.5)
"""Pauses during an outage: 0.2 s doubling to 2 s, jittered so clients do not reconnect in lockstep."""
MAX_REMEMBERED = 256
"""Outages kept per tracker (older ones only matter to waits that ended long ago)."""
BROKEN_WINDOW = 30.0
"""Seconds after a stream broke during which a 401/403 counts as the backend restarting."""
WARMUP_WINDOW = 30.0
"""Seconds from a backend's first 401/403 after an outage during which they count as the restart's
authorization caches filling (a restarted kube-apiserver answers 403 until its RBAC informers synced);
past them a 401/403 is the caller's missing permission, raised at once."""
NO_WAIT_LIMIT: float = settings.NO_WAIT_LIMIT.default
"""Seconds an operation that does not wait for its workers (``wait=False``, ``--no-wait``, the connector's
requests) rides out an outage, unless ``$DDLSCALE_NO_WAIT_LIMIT`` says otherwise (:func:`no_wait_limit`)."""


def no_wait_limit() -> float:
    """The seconds an operation that does not wait rides out an outage: ``$DDLSCALE_NO_WAIT_LIMIT``, else
    :data:`NO_WAIT_LIMIT` (raises InvalidInputError naming the variable for a bad value)."""
    return settings.NO_WAIT_LIMIT.value()


class OutageTracker:
    """The reachability of one backend (``what``, e.g. "the Kubernetes API server at https://..."), as
    :func:`send` reports each attempt to it; thread-safe, shared by every client of the backend."""

    def __init__(self, what: str, logger: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.logger = logger
        """Where the outage's start and end (and the retries of its clients) are logged."""
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: Optional[float] = None
        self._reached = False
        self._served = False
        self._broken_at: Optional[float] = None
        self._refusing_since: Optional[float] = None
        self._past: Deque[Tuple[float, float]] = deque(maxlen=MAX_REMEMBERED)

    @property
    def down(self) -> bool:
        """True while the last attempt failed with an outage symptom."""
        return self._down_since is not None

    @property
    def reached(self) -> bool:
        """True once the backend has answered anything (401/403 and 5xx included): it is at this address."""
        return self._reached

    @property
    def served(self) -> bool:
        """True once the backend has served a request (an answer other than 401/403, 429 and 5xx)."""
        return self._served

    def answered(self, served: bool) -> None:
        """The backend answered; ``served``: with an answer other than a refusal or an outage symptom."""
        self._reached = True
        self._served = self._served or served

    def interrupted(self) -> None:
        """A connection to the backend broke mid-stream (a watch cut): not logged, but a 401/403 within
        :data:`BROKEN_WINDOW` seconds is taken for a restarted backend."""
        self._broken_at = self._clock()

    def unsettled(self) -> bool:
        """True during an outage until :data:`WARMUP_WINDOW` seconds after the backend's first refusal
        since, or within :data:`BROKEN_WINDOW` seconds of a broken connection."""
        now, broken, refusing = self._clock(), self._broken_at, self._refusing_since
        warming = self.down and (refusing is None or now - refusing < WARMUP_WINDOW)
        return warming or (broken is not None and now - broken < BROKEN_WINDOW)

    def refusing(self, reason: str) -> None:
        """The backend, back after an outage, refused a request (401/403): its first refusal starts
        the :data:`WARMUP_WINDOW`; logs once per outage."""
        with self._lock:
            if self._refusing_since is not None or self._down_since is None:
                return
            self._refusing_since = self._clock()
        self.logger.warning(
            "%s answers %s after its outage (a restarted server's authorization caches are still filling); "
            "taken for the restart for %g s, then for a missing permission", self.what, reason, WARMUP_WINDOW,
        )

    def current_outage(self) -> Optional[float]:
        """Seconds the ongoing outage has lasted so far; None while the backend answers."""
        with self._lock:
            since = self._down_since
            return None if since is None else self._clock() - since

    def failed(self, reason: str) -> None:
        """An attempt failed with ``reason``; logs only if this starts an outage."""
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = self._clock()
        self.logger.warning("%s is unreachable (%s); waits keep retrying until their deadline", self.what, reason)

    def now(self) -> float:
        """The tracker's clock: when a request is sent, for :meth:`recovered`."""
        return self._clock()

    def recovered(self, sent_at: Optional[float] = None) -> None:
        """The backend answered; logs the outage's length if one was going on. An answer to a request sent
        (``sent_at``, :meth:`now`) before the outage began ends nothing: it was on its way."""
        with self._lock:
            if sent_at is not None and self._down_since is not None and sent_at < self._down_since:
                return
            since, self._down_since = self._down_since, None
            self._refusing_since = None
            if since is None:
                return
            now = self._clock()
            self._past.append((since, now))
        self.logger.warning("%s is reachable again after %.1f s", self.what, now - since)

    def unreachable_since(self, start: float) -> Tuple[float, int, bool]:
        """(seconds unreachable, number of outages, still down) counted from monotonic time ``start``."""
        with self._lock:
            now = self._clock()
            spans = list(self._past)
            if self._down_since is not None:
                spans.append((self._down_since, now))
            down = self._down_since is not None
        overlapping = [(max(begin, start), end) for begin, end in spans if end > start]
        return sum(end - begin for begin, end in overlapping), len(overlapping), down

    def summary(self, deadline: Deadline) -> str:
        """E.g. "the API server was unreachable for 12.3 s of the 30 s wait (2 outages)"; "" if it never was."""
        seconds, count, down = self.unreachable_since(deadline.started)
        if count == 0:
            return ""
        outages = f"{count} outage{'s' if count != 1 else ''}"
        still = ", still unreachable at the end" if down else ""
        return (
            f"{self.what} was unreachable for {seconds:.1f} s of the "
            f"{round(deadline.timeout, 1):g} s wait ({outages}{still})"
        )


_TRACKERS: "weakref.WeakValueDictionary[str, OutageTracker]" = weakref.WeakValueDictionary()
_TRACKERS_LOCK = threading.Lock()


def shared_tracker(what: str, logger: logging.Logger) -> OutageTracker:
    """The one :class:`OutageTracker` of ``what`` in this process: every client of the same backend
    (several backend objects, a shared informer or poll) reports to it, so an outage is logged once.
    It lives as long as a client holds it, so a later server at the same address starts afresh."""
    with _TRACKERS_LOCK:
        tracker = _TRACKERS.get(what)
        if tracker is None:
            tracker = _TRACKERS[what] = OutageTracker(what, logger)
        return tracker


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything it wraps (causes, contexts, urllib3 reasons, exception arguments)."""
    seen = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue  # None, or a ``reason`` that is text (ssl.SSLError's)
        seen.add(id(current))
        yield current
        todo.extend([current.__cause__, current.__context__, getattr(current, "reason", None)])
        todo.extend(arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException))


def cert_verification_failed(exc: BaseException) -> bool:
    """True when ``exc`` (or anything it wraps) is a TLS certificate verification failure:
    a wrong certificate does not heal by retrying."""
    return any(
        isinstance(current, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(current)
        for current in _chain(exc)
    )


# The one classifier of both HTTP stacks, httpx (scaler service) and urllib3 (Kubernetes client).
# A stack's exceptions are looked up only once it is loaded: one never imported raised nothing.


def _types(module: str, *names: str) -> Tuple[type, ...]:
    """The exception classes ``names`` of ``module`` if it is loaded, else none."""
    loaded = sys.modules.get(module)
    return tuple(getattr(loaded, name) for name in names) if loaded is not None else ()


def _status(exc: BaseException) -> Optional[int]:
    """The HTTP status of an answer raised as an exception (httpx's ``HTTPStatusError``, the Kubernetes
    client's ``ApiException``), else None."""
    if isinstance(exc, _types("httpx", "HTTPStatusError")):
        return int(exc.response.status_code)  # type: ignore[attr-defined]
    if isinstance(exc, _types("kubernetes.client.exceptions", "ApiException")):
        return getattr(exc, "status", None) or 0
    return None


def _connect_failure(exc: BaseException) -> Optional[BaseException]:
    """The failure to open a connection (refused, timed out, urllib3's TLS handshake) ``exc`` is, else None."""
    reason = exc.reason if isinstance(exc, _types("urllib3.exceptions", "MaxRetryError")) else exc
    connect = _types("httpx", "ConnectError", "ConnectTimeout")
    connect += _types("urllib3.exceptions", "NewConnectionError", "ConnectTimeoutError", "SSLError")
    return reason if isinstance(reason, connect) else None


def wire_failure(exc: BaseException) -> Optional[str]:
    """What an outage explains of a request's failure on the wire: an answer 429 or 5xx, a connection refused,
    reset or timed out, a TLS handshake failing for another reason than the certificate; else None."""
    status = _status(exc)
    if status is not None:
        return f"HTTP {status}" if status >= 500 or status == 429 else None
    if cert_verification_failed(exc):
        return None
    if isinstance(exc, _types("httpx", "TransportError")):
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, (OSError, http.client.HTTPException) + _types("urllib3.exceptions", "HTTPError")):
        reason = getattr(exc, "reason", None)
        return type(reason if isinstance(reason, Exception) else exc).__name__
    return None


def symptom(exc: BaseException) -> Optional[str]:
    """What an outage explains: :func:`wire_failure`, or a typed :class:`TransientError` (e.g. no token
    could be had from a proxy that is down, a request of a step failed so)."""
    if isinstance(exc, TransientError):
        return exc.message
    return wire_failure(exc)


def nothing_sent(exc: BaseException) -> bool:
    """The request never left: its connection could not be opened (refused or timed out), or no
    credentials could be had for it."""
    failure = _connect_failure(exc)
    if failure is not None:
        return not isinstance(failure, _types("urllib3.exceptions", "SSLError"))
    return isinstance(exc, TransientError) and bool(getattr(exc, "nothing_sent", False))


def unconnected(exc: BaseException) -> bool:
    """No connection could be made: refused, name not resolved, connect timeout, TLS handshake failed
    (a reset anywhere in the chain is not: something accepted the connection, so the address is right)."""
    return _connect_failure(exc) is not None and not any(isinstance(c, ConnectionResetError) for c in _chain(exc))


def refusal(exc: BaseException) -> Optional[str]:
    """What refused the request: an answer 401/403 ("HTTP 403"), or a token endpoint's refusal; else None."""
    if isinstance(exc, UnauthorizedError):
        return exc.message
    status = _status(exc)
    return f"HTTP {status}" if status in (401, 403) else None


@dataclass(frozen=True)
class RetryRule:
    """How :func:`send` sends a request again: how often, how long and on what.

    ``attempts``: sends of a request safe to repeat whose answer failed on the wire (429, 5xx, a
    connection lost), ``backoff`` apart; 1 for a request not safe to repeat. Under a deadline,
    ``ride_out`` sends it again on every outage symptom until then (``outage_backoff`` apart: a read
    inside a wait, a step rebuilt from a fresh read), and ``unsent`` sends again a request that never
    left or was refused right after an outage (it did nothing). ``conflicts``: a 409 started again
    that many times (the call re-reads before it patches).
    """

    attempts: int = 1
    backoff: Backoff = Backoff(initial=0.2, factor=2.0, cap=2.0)
    ride_out: bool = False
    unsent: bool = True
    conflicts: int = 0
    outage_backoff: Backoff = OUTAGE_BACKOFF


ONCE = RetryRule(unsent=False)
"""One attempt: for a request inside a step that :func:`send` itself sends again."""


def send(
    call: Callable[[], T],
    *,
    tracker: OutageTracker,
    rule: RetryRule,
    deadline: Optional[Deadline] = None,
    what: str = "the request",
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``'s result, sent again as ``rule`` says (never past ``deadline``); else the last error.

    The one retry loop of both backend clients; each failure is classified once (:func:`_again`) and
    reported to ``tracker``; a bounded retry is logged with ``what`` (e.g. "GET /cluster"). Without a
    deadline no outage is waited out: a refusal right after one raises :class:`BackendUnavailableError`
    (transient: a poller reads again).
    """
    outage_pauses, retry_pauses = rule.outage_backoff.intervals(), rule.backoff.intervals()
    retries = conflicts = 0
    while True:
        sent_at = tracker.now()
        try:
            result = call()
        except Exception as exc:  # noqa: BLE001 - classified, then sent again or re-raised
            kind, refused = _again(exc, tracker, sent_at, rule, deadline)
            if kind == "retry" and retries + 1 < rule.attempts:
                retries += 1
                pause = next(retry_pauses) if deadline is None else min(next(retry_pauses), deadline.remaining)
                tracker.logger.info("%s failed (%s); retry %d/%d in %.1fs", what, wire_failure(exc), retries,
                                    rule.attempts - 1, pause)
            elif kind == "conflict" and conflicts < rule.conflicts:
                conflicts += 1
                pause = random.uniform(0.01, 0.05) * conflicts
            elif kind == "outage":
                pause = next(outage_pauses)
            else:
                raise
            failed = exc
        else:
            tracker.answered(served=True)
            tracker.recovered(sent_at)
            return result
        sleep(pause if deadline is None else min(pause, deadline.remaining))
        if kind == "outage" and deadline is not None and deadline.expired:
            if refused is not None and deadline.transient_at_end:
                raise _warming_up(tracker, refused) from None
            raise failed


def _again(
    exc: Exception, tracker: OutageTracker, sent_at: float, rule: RetryRule, deadline: Optional[Deadline]
) -> Tuple[Optional[str], Optional[str]]:
    """Whether ``exc`` is sent again, and why: ("outage" | "retry" | "conflict" | None, the refusal met).

    Reports the attempt to ``tracker``: an answer shows the backend reachable; a symptom from a backend
    never reached raises :class:`NeverReachedError`; a 401/403 counts as the outage's only while the
    tracker is unsettled after the backend served (then, with nothing to ride it out with, it raises
    :class:`BackendUnavailableError`)."""
    time_left = deadline is not None and not deadline.expired
    refused = refusal(exc)
    if refused is not None:
        tracker.answered(served=False)
        if not (tracker.served and tracker.unsettled()):
            tracker.recovered(sent_at)
            return None, None
        tracker.failed(refused)
        tracker.refusing(refused)
        if deadline is None or not (rule.unsent or rule.ride_out) or (deadline.expired and deadline.transient_at_end):
            raise _warming_up(tracker, refused) from None
        return ("outage" if time_left else None), refused
    reason = symptom(exc)
    answer = _status(exc) is not None
    if reason is None:
        if answer:
            tracker.answered(served=True)
            tracker.recovered(sent_at)
        conflict = _status(exc) == 409 or getattr(exc, "status_code", None) == 409  # the step re-reads, builds again
        return ("conflict" if conflict else None), None
    if answer:
        tracker.answered(served=False)
    elif unconnected(exc) and not tracker.reached:
        raise _never_reached(tracker, reason) from exc
    tracker.failed(reason)
    if time_left and (rule.ride_out or (rule.unsent and nothing_sent(exc))):
        return "outage", None
    if (deadline is None or time_left) and wire_failure(exc) is not None:
        return "retry", None
    return None, None


MIN_ATTEMPT_TIMEOUT = 0.1
"""Seconds any request under a deadline still gets, so a wait reads the cluster at least once."""


def attempt_timeout(limit: float, deadline: Optional[Deadline]) -> float:
    """The timeout of one request: ``limit``, cut to what ``deadline`` leaves (at least :data:`MIN_ATTEMPT_TIMEOUT`)."""
    return limit if deadline is None else min(limit, max(deadline.remaining, MIN_ATTEMPT_TIMEOUT))


def _warming_up(tracker: OutageTracker, reason: str) -> BackendUnavailableError:
    """The error of a request refused (``reason``) by ``tracker``'s backend right after its outage."""
    return BackendUnavailableError(
        f"{tracker.what} answered {reason} right after its outage: taken for a restarted server whose "
        f"authorization caches are still filling (for {WARMUP_WINDOW:g} s from its first refusal, then an "
        "access error); try again"
    )


def _never_reached(tracker: OutageTracker, reason: str) -> NeverReachedError:
    """The error of a first request that got no answer from ``tracker``'s backend (``reason``)."""
    return NeverReachedError(
        f"{tracker.what} could not be reached ({reason}) and has not answered once: not retried as an "
        "outage, since a backend that was never reached more likely has a wrong address, port, name or TLS "
        "setting, or a network in between refuses; check them and try again"
    )


def outage_timeout(
    error: TransientError,
    *,
    deadline: Deadline,
    what: str,
    tracker: OutageTracker,
    state: Optional[ClusterState],
    cluster: Optional[str],
) -> ScalingTimeoutError:
    """The :class:`ScalingTimeoutError` of an operation whose backend did not answer before ``deadline``:
    what it waited for, how long the backend was unreachable, the last error and the last state seen."""
    outage = tracker.summary(deadline)
    return ScalingTimeoutError(
        f"timed out after {round(deadline.timeout, 1):g}s waiting for {what}; "
        f"{outage + '; ' if outage else ''}last error: {error.message}; "
        f"last state: {state.describe() if state is not None else 'never read'}",
        cluster=state.cluster if state is not None else cluster,
        state=state,
    )
