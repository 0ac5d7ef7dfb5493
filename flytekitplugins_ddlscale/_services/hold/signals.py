"""Turn SIGTERM/SIGINT into an exception in the main thread for the length of a phase.

Flyte stops a task that times out or is aborted with SIGTERM; without a
handler Python dies on the spot and the cluster stays large. While a phase
runs, the signal raises :class:`PhaseInterrupted` in the main thread so the
phase's cleanup runs; during the cleanup itself signals are only recorded,
so the restore runs exactly once and to the end. A phase outside the main
thread is reached through :class:`SignalRelay` instead.
"""
import contextlib
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any, Dict, Iterator, List, Optional, Protocol, Tuple

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
    """Install :class:`SignalGuard` for ``signums`` on enter; put the previous handlers back on exit.

    Outside the main thread Python cannot install handlers; then nothing is
    installed and :attr:`SignalGuard.active` stays False.
    """

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
    """A :class:`PhaseInterrupted` subclass that takes no arguments and carries ``signum``.

    Python raises an exception in another thread only from a class
    (:func:`raise_in_thread`), so each signal gets one; it is named
    ``PhaseInterrupted`` too, so summaries and tracebacks read the same.
    """
    if signum not in _interrupted_classes:
        def __init__(self: PhaseInterrupted) -> None:
            PhaseInterrupted.__init__(self, signum)

        _interrupted_classes[signum] = type(
            "PhaseInterrupted", (PhaseInterrupted,), {"__init__": __init__, "__module__": __name__}
        )
    return _interrupted_classes[signum]


def raise_in_thread(thread_id: int, signum: int) -> None:
    """Raise :class:`PhaseInterrupted` for ``signum`` in the thread ``thread_id`` at its next Python step.

    A thread blocked in C code (a long ``time.sleep``) sees it only when
    that call returns; the phase's own waits poll in short steps.
    """
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(interrupted_class(signum)))


class RelayedPhase(Protocol):
    """What the relay needs of a phase that runs outside the main thread."""

    def interrupt(self, signum: int) -> None:
        """Restore now for ``signum`` (called in the main thread); returns once the cluster is given back."""


class SignalRelay:
    """SIGTERM/SIGINT handlers, installed once from the main thread, for phases running in other threads.

    Python runs signal handlers only in the main thread, and only the main
    thread may install them; Flyte 2 runs task bodies in other threads (a
    sync body in a thread of its own, an async one on an event loop that
    may be anywhere). The relay's handler asks every attached phase to
    restore (:meth:`RelayedPhase.interrupt`), then does what the handler it
    replaced would have done (the default for SIGTERM ends the process), so
    the cluster is given back before the process goes. With no phase
    attached it only does the latter.
    """

    def __init__(self, signums: Tuple[int, ...] = DEFAULT_SIGNALS) -> None:
        self._signums = signums
        self._previous: Dict[int, Any] = {}
        self._phases: List[RelayedPhase] = []
        self._lock = threading.Lock()

    def install(self) -> bool:
        """Install the handlers (once; main thread only). Returns whether they are in place now."""
        if threading.current_thread() is not threading.main_thread():
            return self.in_place()
        with self._lock:
            for signum in self._signums:
                current = signal.getsignal(signum)
                if current is None or current == self._handle:
                    continue
                self._previous[signum] = current
                signal.signal(signum, self._handle)
        return self.in_place()

    def in_place(self) -> bool:
        """Whether the relay's handler is the one installed for every signal (nothing replaced it since)."""
        return all(signal.getsignal(signum) == self._handle for signum in self._signums)

    def attach(self, phase: RelayedPhase) -> bool:
        """Have ``phase`` restored on a signal; False (nothing attached) when the handlers are not in place."""
        if not self.in_place():
            return False
        with self._lock:
            self._phases.append(phase)
        return True

    def detach(self, phase: RelayedPhase) -> None:
        """Stop relaying signals to ``phase`` (it has ended)."""
        with self._lock:
            if phase in self._phases:
                self._phases.remove(phase)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        with self._lock:
            phases = list(self._phases)
        for phase in phases:
            try:
                phase.interrupt(signum)
            except Exception as exc:  # the next phase and the signal itself must still be served
                logger.error("restoring after %s failed: %s", signal.Signals(signum).name, exc)
        self._chain(signum, frame)

    def _chain(self, signum: int, frame: Optional[FrameType]) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


RELAY = SignalRelay()
"""The process's relay; installed by surfaces whose task bodies run outside the main thread (Flyte 2)."""
