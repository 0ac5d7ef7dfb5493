"""Reads that may be shared with other callers in this process, asked for by a long-lived service.

A connector service answers the status polls of many executions on the same
namespaces and clusters (FlytePropeller polls each one on its resync
interval, 30 s by default, so a thousand executions are dozens of reads a
second). Inside :func:`shared_reads`, a
backend may answer a read from what it shares with every other wait in the
process (the Kubernetes backend's pod informer, kept ``linger`` seconds
after the read; the scaler backend's shared, paced cluster polls, reusing a
read at most ``max_age`` seconds old) instead of sending a request of its
own. Outside it (a CLI command, a task's one-off read), reads go to the
backend as before, so a short-lived process never starts a watch it would
not use again.
"""
import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator, Optional


@dataclass(frozen=True)
class SharedReads:
    """How reads in the current context may be shared."""

    linger: float
    """Seconds a shared watch started for the read is kept after it."""
    max_age: float
    """Age (seconds) of a shared poll result a read may reuse."""


_CURRENT: ContextVar[Optional[SharedReads]] = ContextVar("ddlscale_shared_reads", default=None)


@contextlib.contextmanager
def shared_reads(linger: float = 60.0, max_age: float = 1.0) -> Iterator[SharedReads]:
    """Within the block, backend reads may be served by the process's shared watches and polls."""
    policy = SharedReads(linger, max_age)
    token = _CURRENT.set(policy)
    try:
        yield policy
    finally:
        _CURRENT.reset(token)


def current_shared_reads() -> Optional[SharedReads]:
    """The sharing policy of the current context, or None (reads go to the backend)."""
    return _CURRENT.get()
