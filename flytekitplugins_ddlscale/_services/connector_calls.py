"""The edge of every connector call: an answer within the call budget, and never a traceback.

A poll not answered within ``$DDLSCALE_CONNECTOR_CALL_BUDGET`` is answered RUNNING with the last state
known (FlytePropeller fails a node after a few GetTasks past its deadline; docs/connector.md); anything
unexpected becomes one line, its traceback in the log with credentials masked.
"""
import asyncio
import logging
import threading
import time
import traceback
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Dict, List, Optional, Protocol

from .._core import settings
from .._core.redaction import redact
from ..errors import ScalingError, ScalingTimeoutError
from .connector_meta import ScalingMetadata
from .connector_audit import observe_wait
from .connector_core import FAILED, RUNNING, SUCCEEDED, UNAVAILABLE_HERE, Poll, ScalingService

logger = logging.getLogger("flytekitplugins_ddlscale.connector")

READERS = 64
"""Threads reading for polls at once; a hung backend holds at most one per execution."""
REMEMBERED = 10_000
"""Executions whose last answer this process keeps (the oldest is forgotten first)."""
TIMELINE_POINTS = 50
"""Changes of the worker count kept per execution for ``custom_info``'s timeline: [seconds since the
change was sent, ready workers (existing ones where the backend cannot see readiness)]."""

_READERS = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="ddlscale-connector-poll")


def call_budget() -> float:
    """Seconds a poll waits for the backend before answering from what is known ($DDLSCALE_CONNECTOR_CALL_BUDGET)."""
    return float(settings.CONNECTOR_CALL_BUDGET.value())


def unexpected(call: str, error: BaseException) -> str:
    """Log ``error`` in full (credentials masked) and return the one line a caller gets instead."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    logger.error("unexpected error in the connector's %s: %s", call, redact(text))
    return f"the ddlscale connector's {call} failed unexpectedly ({type(error).__name__}); its log has the details"


def refusal(call: str, error: BaseException) -> ScalingError:
    """``error`` as the one-line error a refused call raises: typed errors as they are, anything else
    logged in full and summed up; no traceback travels with it."""
    if isinstance(error, ScalingError):
        logger.info("refused a %s: %s", call, error)
        return error.with_traceback(None)
    return ScalingError(unexpected(call, error), code="internal")


def refused_create(task_type: str, failure: ScalingError) -> Optional[ScalingMetadata]:
    """A metadata whose first poll is FAILED with ``failure`` (a retry would be refused alike); None where the
    backend being unavailable explains it, which the create raises so that Flyte's retries run it again."""
    if isinstance(failure, UNAVAILABLE_HERE):
        return None
    return ScalingMetadata.refused(task_type, failure)


class Polled(Protocol):
    """What a :class:`PollDesk` asks of the service whose polls it answers (:class:`~.connector_core.ScalingService`)."""

    def poll(self, meta: ScalingMetadata) -> Poll:
        """The poll's answer, read from the backend (it may block)."""

    def cached_answer(self, meta: ScalingMetadata) -> Optional[Poll]:
        """The poll's answer from memory alone, at once, or None where it needs the backend."""

    def unsent_answer(self, meta: ScalingMetadata, why: str) -> Optional[Poll]:
        """The answer of a late poll of a node whose create left its change unsent; None for any other."""

    def failed_at_deadline(self, meta: ScalingMetadata, error: ScalingError) -> ScalingError:
        """``error`` worded as the node's kind words a failed wait; never blocks."""


class PollDesk:
    """Answers the polls of ``service`` within the call budget: its answer, or RUNNING (FAILED past the
    node's deadline) with the last answer known when the backend is slower than the budget."""

    def __init__(self, service: Polled) -> None:
        self._service = service
        self._lock = threading.RLock()  # a read done before add_done_callback calls back at once
        self._reading: Dict[bytes, "Future[Poll]"] = {}
        self._last: "OrderedDict[bytes, Poll]" = OrderedDict()
        self._timelines: Dict[bytes, List[List[float]]] = {}

    async def answer_async(self, meta: ScalingMetadata, budget: Optional[float] = None) -> Poll:
        """The poll's answer within ``budget`` seconds (default :func:`call_budget`), for an event loop:
        answered on the loop where memory holds it (``cached_answer``), else by a reader thread the loop
        awaits without holding one of its own, so a hung backend cannot stall every other poll. Never raises."""
        try:
            limit = call_budget() if budget is None else budget
            key = meta.encode()
            cached = self._cached_answer(key, meta)
            if cached is not None:
                return cached
            reading = self._reading_of(key, meta)
            try:
                # Shielded: a poll that gives up must not cancel the read other polls of it share.
                answer = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(reading)), limit)
            except asyncio.TimeoutError:
                return self._late(meta, key, limit)
            return self._remember(key, meta, answer)
        except Exception as error:  # the edge: nothing leaves as a traceback
            return Poll(FAILED, f"[internal] {unexpected('poll', error)}")

    def _cached_answer(self, key: bytes, meta: ScalingMetadata) -> Optional[Poll]:
        """The poll's answer from memory alone; None where it needs the backend or a read of it is in flight
        (the poll then shares that read)."""
        with self._lock:
            if key in self._reading:
                logger.debug("poll of %s waits for a reader thread (its read in flight)", meta.cluster)
                return None
        answer = self._service.cached_answer(meta)
        if answer is None:
            logger.debug("poll of %s waits for a reader thread (the caches cannot answer)", meta.cluster)
            return None
        return self._remember(key, meta, answer)

    def _reading_of(self, key: bytes, meta: ScalingMetadata) -> "Future[Poll]":
        """The read in flight of the execution ``key`` (``meta`` encoded), started here when none is."""
        with self._lock:
            reading = self._reading.get(key)
            if reading is None:
                reading = _READERS.submit(self._guarded, meta)
                self._reading[key] = reading
                reading.add_done_callback(lambda _done, key=key: self._finished(key))
        return reading

    def _guarded(self, meta: ScalingMetadata) -> Poll:
        try:
            return self._service.poll(meta)
        except Exception as error:  # the edge, in the reading thread
            return Poll(FAILED, f"[internal] {unexpected('poll', error)}")

    def _finished(self, key: bytes) -> None:
        with self._lock:
            self._reading.pop(key, None)

    def _remember(self, key: bytes, meta: ScalingMetadata, answer: Poll) -> Poll:
        with self._lock:
            last = self._last.get(key)
            read = bool(answer.info)
            if last is not None and not read:
                # A poll that could not read (an outage) still shows what was last seen.
                answer = replace(answer, links=answer.links or last.links, info=last.info)
            points = self._timelines.setdefault(key, [])
            workers = answer.info.get("ready_workers")
            if not isinstance(workers, int):  # a backend that cannot see readiness: the pods that exist
                workers = answer.info.get("existing_workers")
            if isinstance(workers, int) and (not points or points[-1][1] != workers):
                points.append([round(max(0.0, time.time() - meta.started), 1), workers])
                del points[:-TIMELINE_POINTS]
            if answer.info:
                answer = replace(answer, info=dict(answer.info, timeline=[list(point) for point in points]))
            if answer.state == RUNNING and read:
                self._last[key] = answer
                self._last.move_to_end(key)
                while len(self._last) > REMEMBERED:
                    old, _ = self._last.popitem(last=False)
                    self._timelines.pop(old, None)
            elif answer.state != RUNNING:
                if answer.state == SUCCEEDED and "elapsed_seconds" in answer.info:  # it waited for its workers
                    observe_wait(meta, answer.info["elapsed_seconds"])
                self._last.pop(key, None)
                self._timelines.pop(key, None)
        return answer

    def _late(self, meta: ScalingMetadata, key: bytes, budget: float) -> Poll:
        with self._lock:
            last = self._last.get(key)
        known = last.message if last is not None else f"nothing read yet from {meta.cluster or 'the backend'}"
        slow = f"the backend did not answer within {budget:g} s (the connector's call budget)"
        unsent = self._service.unsent_answer(meta, slow)
        if unsent is not None:
            return unsent
        if time.time() >= meta.deadline:
            waited = time.time() - meta.started
            timeout = ScalingTimeoutError(f"timed out after {waited:.0f}s; {slow}; last known: {known}", cluster=meta.cluster)
            return Poll(FAILED, str(self._service.failed_at_deadline(meta, timeout)))
        if last is None:
            return Poll(RUNNING, f"{slow}; reading again ({known})")
        return replace(last, message=f"{slow}; last known: {known}")

