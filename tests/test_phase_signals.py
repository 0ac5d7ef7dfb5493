"""Signal handling of a phase: SIGTERM/SIGINT become an exception, deferred during cleanup, handlers put back."""
import os
import signal
import threading

import pytest

from flytekitplugins_ddlscale._services.hold.signals import PhaseInterrupted, SignalsAsExceptions


def test_signal_raises_in_the_main_thread_and_previous_handler_returns():
    previous = signal.getsignal(signal.SIGTERM)
    guarded = SignalsAsExceptions()
    guard = guarded.install()
    try:
        assert guard.active
        with pytest.raises(PhaseInterrupted) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
        assert info.value.signum == signal.SIGTERM
        assert not isinstance(info.value, Exception)  # `except Exception` in user code must not swallow it
    finally:
        guarded.uninstall()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_signals_during_cleanup_are_recorded_not_raised():
    guarded = SignalsAsExceptions((signal.SIGINT,))
    guard = guarded.install()
    try:
        with guard.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        assert guard.pending == signal.SIGINT
    finally:
        guarded.uninstall()


def test_outside_the_main_thread_nothing_is_installed():
    seen = {}

    def run():
        guarded = SignalsAsExceptions()
        seen["active"] = guarded.install().active
        guarded.uninstall()

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert seen == {"active": False}
