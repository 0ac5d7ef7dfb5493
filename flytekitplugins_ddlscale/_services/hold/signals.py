"""Turn SIGTERM/SIGINT into an exception in the main thread for the length of a phase.

Flyte stops a task with SIGTERM, and without a handler the process dies with the cluster still large.
While a phase runs the signal raises :class:`PhaseInterrupted` in the main thread, so the cleanup runs;
during the cleanup signals are only recorded, so the restore runs once and to the end. A phase outside
the main thread is reached through :class:`SignalRelay`.
"""
import contextlib
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Set, Tuple

logger = logging.getLogger("flytekitplugins_ddlscale")

DEFAULT_SIGNALS: Tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)


class PhaseInterrupted(KeyboardInterrupt):
    """A phase was stopped by a signal; a KeyboardInterrupt so ``except Exception`` does not swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


class SignalGuard:
    """Raises on a signal, or only records it while :meth:`deferred` is active."""

    def __init__(self) -> None:
        self.pending: Optional[int] = None
        self._deferring = False
        self.active = False

    def handle(self, signum: int, frame: Optional[FrameType]) -> None:
        """The installed handler."""
        if self._deferring:
            logger.warning("%s received during cluster restore; finishing the restore first",
                           signal.Signals(signum).name)
            self.pending = signum
            return
        raise PhaseInterrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Within this block signals are recorded in :attr:`pending` instead of raising."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False


class SignalsAsExceptions:
    """Install :class:`SignalGuard` for ``signums``, then put the previous handlers back (outside the main
    thread nothing is installed and :attr:`SignalGuard.active` stays False)."""

    def __init__(self, signums: Tuple[int, ...] = DEFAULT_SIGNALS) -> None:
        self.guard = SignalGuard()
        self._signums = signums
        self._previous: Dict[int, Any] = {}

    def install(self) -> SignalGuard:
        """Install the handlers (main thread only) and return the guard."""
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not in the main thread: phase cannot catch SIGTERM/SIGINT")
            return self.guard
        for signum in self._signums:
            previous = signal.getsignal(signum)
            if previous is None:
                # Installed from C code: it could not be put back, so leave it alone.
                continue
            self._previous[signum] = previous
            signal.signal(signum, self.guard.handle)
        self.guard.active = bool(self._previous)
        return self.guard

    def uninstall(self) -> None:
        """Put the previous handlers back."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        self.guard.active = False


_interrupted_classes: Dict[int, type] = {}


def interrupted_class(signum: int) -> type:
    """A :class:`PhaseInterrupted` subclass, named the same, that takes no arguments and carries ``signum``
    (Python raises in another thread only from a class: :func:`raise_in_thread`)."""
    if signum not in _interrupted_classes:
        def __init__(self: PhaseInterrupted) -> None:
            PhaseInterrupted.__init__(self, signum)

        _interrupted_classes[signum] = type(
            "PhaseInterrupted", (PhaseInterrupted,), {"__init__": __init__, "__module__": __name__}
        )
    return _interrupted_classes[signum]


def raise_in_thread(thread_id: int, signum: int) -> None:
    """Raise :class:`PhaseInterrupted` for ``signum`` in the thread ``thread_id`` at its next Python step
    (a thread blocked in C code sees it when that call returns)."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(interrupted_class(signum)))


class RelayedPhase(Protocol):
    """What the relay needs of a phase that runs outside the main thread."""

    def interrupt(self, signum: int) -> None:
        """Restore now for ``signum`` (called in the main thread); returns once the cluster is given back."""


class SignalRelay:
    """SIGTERM/SIGINT handlers, installed once from the main thread, for phases in other threads (Flyte 2's
    task bodies): every attached phase gives its cluster back, the :meth:`after_phases` callbacks run, then
    the handler it replaced does what it would have done (for SIGTERM, end the process)."""

    def __init__(self, signums: Tuple[int, ...] = DEFAULT_SIGNALS) -> None:
        self._signums = signums
        self._previous: Dict[int, Any] = {}
        """Per signal: the handler the relay replaced last (what it chains to)."""
        self._original: Dict[int, Any] = {}
        """Per signal: the handler before the relay was first installed (what a re-entered relay chains to)."""
        self._phases: List[RelayedPhase] = []
        self._after: List[Callable[[int], None]] = []
        self._handling: Set[int] = set()
        self._lock = threading.Lock()

    def install(self) -> bool:
        """Install the handlers (main thread only; again on top of any installed since). Returns whether
        they are in place now."""
        if threading.current_thread() is not threading.main_thread():
            return self.in_place()
        with self._lock:
            for signum in self._signums:
                current = signal.getsignal(signum)
                if current is None or current == self._handle:
                    continue
                self._original.setdefault(signum, current)
                self._previous[signum] = current
                signal.signal(signum, self._handle)
        return self.in_place()

    def in_place(self) -> bool:
        """Whether the relay's handler is the one installed for every signal (nothing replaced it since)."""
        return all(signal.getsignal(signum) == self._handle for signum in self._signums)

    def replaced(self) -> Dict[str, Any]:
        """The signals whose handler code installed after the relay replaced: signal name -> that handler."""
        return {
            signal.Signals(signum).name: signal.getsignal(signum)
            for signum in self._previous
            if signal.getsignal(signum) != self._handle
        }

    def attach(self, phase: RelayedPhase) -> bool:
        """Have ``phase`` restored on a signal; False (nothing attached) when the relay was never installed.
        Where a later handler replaced the relay's, a warning says what happens on that signal."""
        if not self._previous:
            return False
        with self._lock:
            self._phases.append(phase)
        for name, handler in self.replaced().items():
            logger.warning(
                "%s handler replaced after ddlscale installed its signal relay (now %r): on %s the cluster is "
                "given back only if that handler calls the one it replaced; otherwise the cluster keeps the "
                "phase's size when the process ends, until restored (a RestoreCluster node or `ddlscale restore`)",
                name, handler, name,
            )
        return True

    def detach(self, phase: RelayedPhase) -> None:
        """Stop relaying signals to ``phase`` (it has ended)."""
        with self._lock:
            if phase in self._phases:
                self._phases.remove(phase)

    def after_phases(self, callback: Callable[[int], None]) -> None:
        """Run ``callback(signum)`` on every relayed signal, after the phases gave back (once per callback)."""
        with self._lock:
            if callback not in self._after:
                self._after.append(callback)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if signum in self._handling:
            # Reached again through a newer handler that calls the one it replaced: the outer call served
            # the phases; chaining to that handler again would loop.
            self._chain(self._original.get(signum, signal.SIG_DFL), signum, frame)
            return
        self._handling.add(signum)
        try:
            with self._lock:
                phases = list(self._phases)
                after = list(self._after)
            for phase in phases:
                try:
                    phase.interrupt(signum)
                except Exception as exc:  # the next phase and the signal itself must still be served
                    logger.error("restoring after %s failed: %s", signal.Signals(signum).name, exc)
            for callback in after:
                try:
                    callback(signum)
                except Exception as exc:  # a report must not hide the signal
                    logger.error("after %s: %s failed: %s", signal.Signals(signum).name, callback, exc)
            self._chain(self._previous.get(signum, signal.SIG_DFL), signum, frame)
        finally:
            self._handling.discard(signum)

    @staticmethod
    def _chain(previous: Any, signum: int, frame: Optional[FrameType]) -> None:
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


RELAY = SignalRelay()
"""The process's relay; installed by surfaces whose task bodies run outside the main thread (Flyte 2)."""
