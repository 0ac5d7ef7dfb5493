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

    def deadline(self) -> Optional[Deadline]:
        """A deadline of :attr:`budget` seconds from now (a :class:`ReadBudget`), or None without a budget."""
        return ReadBudget(self.budget) if self.budget is not None else None


_CURRENT: ContextVar[Optional[SharedReads]] = ContextVar("ddlscale_shared_reads", default=None)


@contextlib.contextmanager
def shared_reads(linger: float = 60.0, max_age: float = 1.0, budget: Optional[float] = None) -> Iterator[SharedReads]:
    """Within the block, backend reads may be served by the process's shared watches and polls (and
    those sent give up after ``budget`` seconds)."""
    policy = SharedReads(linger, max_age, budget)
    token = _CURRENT.set(policy)
    try:
        yield policy
    finally:
        _CURRENT.reset(token)


def current_shared_reads() -> Optional[SharedReads]:
    """The sharing policy of the current context, or None (reads go to the backend)."""
    return _CURRENT.get()
