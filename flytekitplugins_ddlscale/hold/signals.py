"""Turn SIGTERM/SIGINT into an exception in the main thread for the length of a phase.

Flyte stops a task that times out or is aborted with SIGTERM; without a
handler Python dies on the spot and the cluster stays large. While a phase
runs, the signal raises :class:`PhaseInterrupted` in the main thread so the
phase's cleanup runs; during the cleanup itself signals are only recorded,
so the restore runs exactly once and to the end.
"""
import contextlib
import logging
import signal
import threading
from types import FrameType
from typing import Any, Dict, Iterator, Optional, Tuple

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
