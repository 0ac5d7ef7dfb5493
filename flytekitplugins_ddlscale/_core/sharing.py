"""Reads that may be shared with other callers in this process, asked for by a long-lived service.

A connector service answers the status polls of many executions on the same
namespaces and clusters (FlytePropeller polls each one on its resync
interval, 30 s by default, so a thousand executions are dozens of reads a
second). Inside :func:`shared_reads`, a
backend may answer a read from what it shares with every other wait in the
process (the Kubernetes backend's pod informer, kept ``linger`` seconds
after the read, and the shared watch of the cluster objects of its kind; the
scaler backend's shared, paced cluster polls, reusing a read at most
``max_age`` seconds old) instead of sending a request of its own, and a read
that must go to the backend gives up after ``budget`` seconds (a service
answering within a call budget must not leave reads running past it).
Outside it (a CLI command, a task's one-off read), reads go to the backend
as before, so a short-lived process never starts a watch it would
not use again.

With ``cache_only``, a read that the shared caches cannot answer raises
:class:`CacheMiss` instead of sending a request or waiting for one (the
layers that send or wait call :func:`refuse_in_cache_only` first): an event
loop answers a poll on the loop itself when the caches can, and hands it to
a reader thread when they cannot.
"""
import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator, Optional

from .waiting import Deadline, ReadBudget


@dataclass(frozen=True)
class SharedReads:
    """How reads in the current context may be shared."""

    linger: float
    """Seconds a shared watch started for the read is kept after it."""
    max_age: float
    """Age (seconds) of a shared poll result a read may reuse."""
    budget: Optional[float] = None
    """Seconds a read that goes to the backend may take, riding out an outage meanwhile (then it raises
    a :class:`~flytekitplugins_ddlscale.errors.TransientError`); None: the backend's own timeouts."""

    cache_only: bool = False
    """Whether a read the shared caches cannot answer raises :class:`CacheMiss` rather than sending or
    waiting (a caller that must not block: an event loop)."""
    not_before: Optional[float] = None
    """Wall-clock time (epoch seconds) before which a shared poll result must not have been begun to be
    reused: a change was sent then, perhaps by another process (a connector replica's create), and a
    read begun earlier may not show it. None: any result within :attr:`max_age`."""

    def deadline(self) -> Optional[Deadline]:
        """A deadline of :attr:`budget` seconds from now (a :class:`ReadBudget`), or None without a budget."""
        return ReadBudget(self.budget) if self.budget is not None else None


class CacheMiss(BaseException):
    """A read under ``shared_reads(cache_only=True)`` needs a request or a wait: nothing was sent, the
    caller reads again where it may block.

    A BaseException, as :class:`KeyboardInterrupt` is: the retry loops and the error translation on the
    way up catch ``Exception`` and must let it through untouched (it is not a failure of the backend)."""


_CURRENT: ContextVar[Optional[SharedReads]] = ContextVar("ddlscale_shared_reads", default=None)


@contextlib.contextmanager
def shared_reads(
    linger: float = 60.0, max_age: float = 1.0, budget: Optional[float] = None, cache_only: bool = False,
    not_before: Optional[float] = None,
) -> Iterator[SharedReads]:
    """Within the block, backend reads may be served by the process's shared watches and polls (and
    those sent give up after ``budget`` seconds; with ``cache_only``, none is sent: :class:`CacheMiss`;
    a shared poll begun before ``not_before``, epoch seconds, is not reused)."""
    policy = SharedReads(linger, max_age, budget, cache_only, not_before)
    token = _CURRENT.set(policy)
    try:
        yield policy
    finally:
        _CURRENT.reset(token)


def current_shared_reads() -> Optional[SharedReads]:
    """The sharing policy of the current context, or None (reads go to the backend)."""
    return _CURRENT.get()


def refuse_in_cache_only(what: str) -> None:
    """Raise :class:`CacheMiss` (naming ``what``, the request or wait refused) when the current context
    answers from the shared caches only; return otherwise."""
    policy = _CURRENT.get()
    if policy is not None and policy.cache_only:
        raise CacheMiss(what)
