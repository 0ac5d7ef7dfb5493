"""The outage tracker and the retry loop shared by both remote backends.

The backends' behaviour during real outages is tested against the test
servers behind a fault proxy (tests/reliability/test_reliability_outages.py);
these tests pin the bookkeeping: one log line per outage start and end,
the arithmetic of "unreachable for X s of the wait", and which failures are
retried.
"""
import itertools
import logging
import ssl
from typing import List

import pytest

from flytekitplugins_ddlscale._core import outage
from flytekitplugins_ddlscale._core.outage import (
    NeverReachedError,
    OutageTracker,
    cert_verification_failed,
    retry_through_outage,
)
from flytekitplugins_ddlscale._core.waiting import Backoff, Deadline
from flytekitplugins_ddlscale.errors import BackendUnavailableError, TransientError
from tests.clock_support import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock(1000.0)


@pytest.fixture
def tracker(clock: Clock) -> OutageTracker:
    return OutageTracker("the test server", logging.getLogger("flytekitplugins_ddlscale.test"), clock=clock)


def messages(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [r.getMessage() for r in caplog.records if r.name == "flytekitplugins_ddlscale.test"]


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(tracker, clock, caplog):
    caplog.set_level(logging.INFO)
    for _ in range(5):
        tracker.failed("ConnectError")
        clock.now += 0.5
    tracker.recovered()
    tracker.recovered()
    assert messages(caplog) == [
        "the test server is unreachable (ConnectError); waits keep retrying until their deadline",
        "the test server is reachable again after 2.5 s",
    ]



def test_an_answer_to_a_request_sent_before_the_outage_does_not_end_it(tracker, clock, caplog):
    """A request on its way when the backend went down may still be answered (its connection was up);
    that says nothing about the backend now: one outage, not two."""
    caplog.set_level(logging.INFO)
    in_flight = tracker.now()
    clock.now += 0.1
    tracker.failed("ProtocolError")
    tracker.recovered(sent_at=in_flight)
    assert tracker.down
    clock.now += 2.0
    tracker.failed("ConnectError")
    tracker.recovered(sent_at=tracker.now())
    assert messages(caplog) == [
        "the test server is unreachable (ProtocolError); waits keep retrying until their deadline",
        "the test server is reachable again after 2.0 s",
    ]

def test_summary_counts_only_outages_within_the_wait(tracker, clock):
    tracker.failed("x")
    clock.now += 4.0
    tracker.recovered()  # 1000-1004: before the wait
    clock.now += 1.0
    deadline = Deadline(30)
    deadline.started = clock.now - 2.0  # the wait began at 1003: 1 s of that outage overlaps it
    clock.now += 5.0
    tracker.failed("y")
    clock.now += 3.0
    tracker.recovered()
    assert tracker.unreachable_since(deadline.started) == (4.0, 2, False)
    assert tracker.summary(deadline) == "the test server was unreachable for 4.0 s of the 30 s wait (2 outages)"


def test_summary_names_an_outage_still_going_on(tracker, clock):
    deadline = Deadline(2.5)
    deadline.started = clock.now
    clock.now += 0.5
    tracker.failed("ConnectError")
    clock.now += 2.0
    assert tracker.summary(deadline) == (
        "the test server was unreachable for 2.0 s of the 2.5 s wait (1 outage, still unreachable at the end)"
    )


def test_summary_is_empty_without_an_outage(tracker):
    assert tracker.summary(Deadline(10)) == ""


def test_transient_failures_are_retried_until_the_call_succeeds(tracker):
    answers = iter([ConnectionRefusedError(), ConnectionResetError(), "ok"])
    pauses: List[float] = []

    def call() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    result = retry_through_outage(
        call, tracker=tracker, symptom=lambda exc: type(exc).__name__, deadline=Deadline(30),
        backoff=Backoff(initial=0.2, factor=2.0, cap=2.0), sleep=pauses.append,
    )
    assert result == "ok" and pauses == [0.2, 0.4] and not tracker.down


def test_errors_retrying_cannot_fix_are_raised_at_once(tracker):
    calls = itertools.count()

    def call() -> None:
        next(calls)
        raise PermissionError("403")

    with pytest.raises(PermissionError):
        retry_through_outage(call, tracker=tracker, symptom=lambda exc: None, deadline=Deadline(30), sleep=lambda s: None)
    assert next(calls) == 1


def test_a_failure_that_may_have_been_sent_is_not_retried_when_only_refusals_are(tracker):
    calls = itertools.count()

    def call() -> None:
        next(calls)
        raise TimeoutError("answer lost")

    with pytest.raises(TimeoutError):
        retry_through_outage(
            call, tracker=tracker, symptom=lambda exc: "timeout", deadline=Deadline(30),
            retry_if=lambda exc: isinstance(exc, ConnectionRefusedError), sleep=lambda s: None,
        )
    assert next(calls) == 1 and tracker.down


def test_without_a_deadline_there_is_one_attempt(tracker):
    calls = itertools.count()

    def call() -> None:
        next(calls)
        raise ConnectionRefusedError()

    with pytest.raises(ConnectionRefusedError):
        retry_through_outage(call, tracker=tracker, symptom=lambda exc: "refused", deadline=None)
    assert next(calls) == 1


def test_retries_stop_at_the_deadline(tracker):
    deadline = Deadline(0.05)
    slept: List[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        deadline.expires = 0.0  # time is up after the first pause

    with pytest.raises(ConnectionRefusedError):
        retry_through_outage(
            lambda: (_ for _ in ()).throw(ConnectionRefusedError()), tracker=tracker,
            symptom=lambda exc: "refused", deadline=deadline, sleep=sleep,
        )
    assert len(slept) == 1 and slept[0] <= 0.05


class Refused(Exception):
    """A 403 answer."""


def scripted(*answers: object):
    """A call that raises or returns ``answers`` in turn, counting its calls."""
    queue = iter(answers)

    def call() -> object:
        call.calls += 1  # type: ignore[attr-defined]
        answer = next(queue)
        if isinstance(answer, Exception):
            raise answer
        return answer

    call.calls = 0  # type: ignore[attr-defined]
    return call


def classified(call, tracker, deadline=None):
    return retry_through_outage(
        call, tracker=tracker, symptom=lambda exc: type(exc).__name__ if isinstance(exc, OSError) else None,
        deadline=deadline if deadline is not None else Deadline(30),
        unconnected=lambda exc: isinstance(exc, ConnectionRefusedError),
        refused=lambda exc: "HTTP 403" if isinstance(exc, Refused) else None, sleep=lambda s: None,
    )


def test_a_backend_never_reached_is_not_an_outage(tracker, caplog):
    caplog.set_level(logging.INFO)
    call = scripted(ConnectionRefusedError(), "ok")
    with pytest.raises(NeverReachedError) as caught:
        classified(call, tracker)
    assert call.calls == 1 and "has not answered once" in str(caught.value)
    assert messages(caplog) == [] and not tracker.down


def test_a_backend_that_answered_once_is_ridden_out_when_it_refuses_connections(tracker):
    classified(scripted("ok"), tracker)
    call = scripted(ConnectionRefusedError(), ConnectionRefusedError(), "ok")
    assert classified(call, tracker) == "ok" and call.calls == 3


def test_a_backend_that_accepts_but_has_not_answered_yet_is_ridden_out(tracker):
    call = scripted(ConnectionResetError(), TimeoutError(), "ok")  # connected, no answer yet: not "never reached"
    assert classified(call, tracker) == "ok" and call.calls == 3


def test_refusals_right_after_an_outage_are_ridden_out_and_logged_once(tracker, caplog):
    caplog.set_level(logging.INFO)
    classified(scripted("ok"), tracker)
    call = scripted(ConnectionRefusedError(), Refused(), Refused(), Refused(), "ok")
    assert classified(call, tracker) == "ok" and call.calls == 5
    refusing = [m for m in messages(caplog) if "answers HTTP 403 after its outage" in m]
    assert len(refusing) == 1 and not tracker.down


def test_a_refusal_that_does_not_follow_an_outage_is_raised_at_once(tracker):
    classified(scripted("ok"), tracker)
    call = scripted(Refused(), "ok")
    with pytest.raises(Refused):
        classified(call, tracker)
    assert call.calls == 1


def test_a_refusal_on_first_contact_after_refused_connections_is_raised_at_once(tracker):
    tracker.answered(served=False)  # it answered 503 before, but never served a request
    call = scripted(ConnectionRefusedError(), Refused(), "ok")
    with pytest.raises(Refused):
        classified(call, tracker)
    assert call.calls == 2


def test_refusals_after_an_outage_end_at_the_deadline(tracker):
    classified(scripted("ok"), tracker)
    deadline = Deadline(30)
    refusals = [Refused() for _ in range(3)]

    def call() -> None:
        if len(refusals) == 1:
            deadline.expires = 0.0
        raise refusals.pop() if refusals else ConnectionRefusedError()

    tracker.failed("ConnectionRefusedError")
    with pytest.raises(Refused):
        classified(call, tracker, deadline)
    assert tracker.down


def test_a_refusal_right_after_an_outage_without_a_deadline_is_transient(tracker):
    """A poller (the connector's GetTask) makes one attempt: the restarted server's 403 must leave it
    reading again, not fail its node for a permission it has."""
    classified(scripted("ok"), tracker)
    with pytest.raises(ConnectionRefusedError):
        retry_through_outage(scripted(ConnectionRefusedError()), tracker=tracker, deadline=None,
                             symptom=lambda exc: "refused", refused=lambda exc: None)
    with pytest.raises(BackendUnavailableError) as caught:
        retry_through_outage(scripted(Refused()), tracker=tracker, deadline=None,
                             refused=lambda exc: "HTTP 403" if isinstance(exc, Refused) else None)
    assert isinstance(caught.value, TransientError) and tracker.down
    assert "the test server answered HTTP 403 right after its outage" in str(caught.value)


def test_refusals_past_the_warmup_window_are_a_missing_permission(tracker, clock, caplog):
    """The window runs from the first refusal after the outage, not from the last refused connection:
    a server back and answering 403 for WARMUP_WINDOW seconds is refusing this caller, and says so at once."""
    caplog.set_level(logging.INFO)
    classified(scripted("ok"), tracker)
    tracker.failed("ConnectionRefusedError")

    def refuse() -> None:  # one read without a deadline, as a connector's poll makes
        retry_through_outage(scripted(Refused()), tracker=tracker, deadline=None,
                             refused=lambda exc: "HTTP 403" if isinstance(exc, Refused) else None)

    with pytest.raises(BackendUnavailableError):
        refuse()
    clock.now += outage.WARMUP_WINDOW - 0.1
    with pytest.raises(BackendUnavailableError):
        refuse()
    clock.now += 0.1
    with pytest.raises(Refused):
        refuse()
    assert not tracker.down
    assert messages(caplog)[-1] == f"the test server is reachable again after {outage.WARMUP_WINDOW:.1f} s"
    with pytest.raises(Refused):  # and on a healthy server a refusal stays final
        refuse()


def test_jittered_backoff_stays_within_its_band():
    steps = list(itertools.islice(Backoff(initial=0.2, factor=2.0, cap=2.0, jitter=0.5).intervals(), 200))
    nominal = list(itertools.islice(Backoff(initial=0.2, factor=2.0, cap=2.0).intervals(), 200))
    assert all(n * 0.5 <= s <= n for s, n in zip(steps, nominal))
    assert len(set(steps[10:])) > 1  # not all the same: clients do not come back in lockstep


def test_certificate_verification_failures_are_recognised_through_wrappers():
    inner = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    try:
        try:
            raise inner
        except ssl.SSLError as exc:
            raise OSError("connect failed") from exc
    except OSError as wrapped:
        assert cert_verification_failed(wrapped)
    assert not cert_verification_failed(ConnectionResetError("reset during handshake"))


# ----- one classifier for both HTTP stacks -----


def test_a_refused_connection_is_one_symptom_whichever_http_stack_met_it():
    """httpx (the scaler service) and urllib3 under the Kubernetes client (the API server) fail a refused
    connection with their own exceptions; the one classifier reads both the same way."""
    import httpx
    import urllib3

    from tests.port_support import free_port

    url = f"http://127.0.0.1:{free_port()}/"  # nothing listens there
    with pytest.raises(httpx.ConnectError) as by_httpx:
        httpx.get(url, timeout=5)
    with pytest.raises(urllib3.exceptions.MaxRetryError) as by_urllib3:
        urllib3.PoolManager().request("GET", url, retries=urllib3.Retry(0), timeout=5)
    for failure in (by_httpx.value, by_urllib3.value):
        assert outage.symptom(failure) and outage.wire_failure(failure)
        assert outage.nothing_sent(failure) and outage.unconnected(failure) and outage.refusal(failure) is None


def test_answers_raised_by_either_stack_are_classified_by_their_status():
    import httpx
    from kubernetes.client.exceptions import ApiException

    def answered(status: int) -> httpx.HTTPStatusError:
        response = httpx.Response(status, request=httpx.Request("GET", "http://scaler.invalid/cluster"))
        return httpx.HTTPStatusError(f"HTTP {status}", request=response.request, response=response)

    for status in (429, 502, 503):
        assert outage.symptom(answered(status)) == outage.symptom(ApiException(status=status)) == f"HTTP {status}"
    for status in (401, 403):
        assert outage.refusal(answered(status)) == outage.refusal(ApiException(status=status)) == f"HTTP {status}"
        assert outage.symptom(answered(status)) is None
    for failure in (answered(503), ApiException(status=503)):
        assert not outage.nothing_sent(failure) and not outage.unconnected(failure)
