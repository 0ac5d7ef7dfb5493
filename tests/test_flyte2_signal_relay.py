"""The signal relay the Flyte 2 surface installs, when other code installs its own handler afterwards.

Each test uses a relay of its own on SIGUSR1 (so the process's SIGTERM and
SIGINT are left alone), with a handler that records calls as the one in
place before it, and puts that signal's handler back afterwards. Phases
attach from another thread, as Flyte 2 task bodies do.
"""
import logging
import os
import signal
import threading

import pytest

from flytekitplugins_ddlscale._services.hold.signals import SignalRelay

SIGNUM = signal.SIGUSR1


class Recorder:
    """Records what it was called for: a phase (``interrupt``) or a handler (called with signum, frame)."""

    def __init__(self, name, calls, chain_to=None):
        self.name, self.calls, self.chain_to = name, calls, chain_to

    def interrupt(self, signum):
        self.calls.append((self.name, signum))

    def __call__(self, signum, frame):
        self.calls.append((self.name, signum))
        if self.chain_to is not None:
            self.chain_to(signum, frame)


@pytest.fixture
def calls():
    """The calls, in order; SIGUSR1's handler is put back after the test."""
    before = signal.getsignal(SIGNUM)
    recorded = []
    signal.signal(SIGNUM, Recorder("original", recorded))
    yield recorded
    signal.signal(SIGNUM, before)


def deliver():
    """SIGUSR1 to this process; its handler runs in the main thread before this returns."""
    os.kill(os.getpid(), SIGNUM)
    for _ in range(1000):
        pass


def attach_from_a_thread(relay, phase):
    """``relay.attach(phase)`` from another thread (where a Flyte 2 body starts its phase)."""
    answer = {}
    worker = threading.Thread(target=lambda: answer.setdefault("attached", relay.attach(phase)))
    worker.start()
    worker.join()
    return answer["attached"]


def test_a_later_handler_that_calls_the_one_it_replaced_still_reaches_the_phase(calls, caplog):
    relay = SignalRelay((SIGNUM,))
    assert relay.install()
    later = Recorder("later", calls, chain_to=signal.getsignal(SIGNUM))
    signal.signal(SIGNUM, later)
    assert relay.replaced() == {"SIGUSR1": later}
    with caplog.at_level(logging.WARNING, logger="flytekitplugins_ddlscale"):
        assert attach_from_a_thread(relay, Recorder("phase", calls))
    assert "SIGUSR1 handler replaced after ddlscale installed its signal relay" in caplog.text
    assert "given back only if that handler calls the one it replaced" in caplog.text
    deliver()
    assert calls == [("later", SIGNUM), ("phase", SIGNUM), ("original", SIGNUM)]


def test_a_later_handler_that_does_not_chain_leaves_the_phase_unreached_as_the_warning_says(calls, caplog):
    relay = SignalRelay((SIGNUM,))
    relay.install()
    signal.signal(SIGNUM, Recorder("later", calls))
    with caplog.at_level(logging.WARNING, logger="flytekitplugins_ddlscale"):
        attach_from_a_thread(relay, Recorder("phase", calls))
    assert "otherwise the cluster keeps the phase's size when the process ends" in caplog.text
    deliver()
    assert calls == [("later", SIGNUM)]


def test_installing_again_puts_the_relay_on_top_and_a_handler_chaining_back_does_not_loop(calls):
    relay = SignalRelay((SIGNUM,))
    relay.install()
    signal.signal(SIGNUM, Recorder("later", calls, chain_to=signal.getsignal(SIGNUM)))
    assert not relay.in_place()
    assert relay.install() and relay.in_place()  # e.g. another node or phase defined at import
    assert attach_from_a_thread(relay, Recorder("phase", calls))
    relay.after_phases(lambda signum: calls.append(("after", signum)))
    deliver()
    # The phase once, the callbacks after it, the later handler, then (through its chain) the original once.
    assert calls == [("phase", SIGNUM), ("after", SIGNUM), ("later", SIGNUM), ("original", SIGNUM)]


def test_a_relay_never_installed_attaches_nothing(calls):
    relay = SignalRelay((SIGNUM,))
    assert attach_from_a_thread(relay, Recorder("phase", calls)) is False
    assert relay.replaced() == {}
