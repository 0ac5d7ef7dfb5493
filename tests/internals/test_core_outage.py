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
from flytekitplugins_ddlscale._core.outage import NeverReachedError, OutageTracker, RetryRule, cert_verification_failed, send
from flytekitplugins_ddlscale._core.waiting import Backoff, Deadline
from flytekitplugins_ddlscale.errors import BackendUnavailableError, ConflictError, TransientError, UnauthorizedError
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


READ = RetryRule(ride_out=True, outage_backoff=Backoff(initial=0.2, factor=2.0, cap=2.0))
"""A read inside a wait, its outage pauses without jitter so they can be compared."""


class Refused(UnauthorizedError):
    """A 403 answer."""


def unconnected() -> Exception:
    """A connection that could not be opened (a backend never reached, if it never answered)."""
    import httpx

    return httpx.ConnectError("connection refused")


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


def test_transient_failures_are_retried_until_the_call_succeeds(tracker):
    pauses: List[float] = []
    call = scripted(ConnectionRefusedError(), ConnectionResetError(), "ok")
    result = send(call, tracker=tracker, rule=READ, deadline=Deadline(30), sleep=pauses.append)
    assert result == "ok" and pauses == [0.2, 0.4] and not tracker.down


def test_a_request_safe_to_repeat_is_retried_a_bounded_number_of_times_without_a_deadline(tracker, caplog):
    caplog.set_level(logging.INFO)
    pauses: List[float] = []
    call = scripted(ConnectionResetError(), ConnectionResetError(), ConnectionResetError(), "ok")
    with pytest.raises(ConnectionResetError):
        send(call, tracker=tracker, rule=RetryRule(attempts=3), what="GET /x", sleep=pauses.append)
    assert call.calls == 3 and pauses == [0.2, 0.4]
    assert "GET /x failed (ConnectionResetError); retry 2/2 in 0.4s" in messages(caplog)


def test_errors_retrying_cannot_fix_are_raised_at_once(tracker):
    call = scripted(ValueError("not an outage"), "ok")
    with pytest.raises(ValueError):
        send(call, tracker=tracker, rule=READ, deadline=Deadline(30), sleep=lambda s: None)
    assert call.calls == 1


def test_a_write_that_may_have_been_sent_is_not_retried(tracker):
    call = scripted(TimeoutError("answer lost"), "ok")
    with pytest.raises(TimeoutError):
        send(call, tracker=tracker, rule=RetryRule(), deadline=Deadline(30), sleep=lambda s: None)
    assert call.calls == 1 and tracker.down


def test_a_write_never_sent_is_sent_again_under_a_deadline(tracker):
    send(scripted("ok"), tracker=tracker, rule=READ)
    call = scripted(unconnected(), unconnected(), "ok")
    assert send(call, tracker=tracker, rule=RetryRule(), deadline=Deadline(30), sleep=lambda s: None) == "ok"
    assert call.calls == 3


def test_without_a_deadline_there_is_one_attempt(tracker):
    call = scripted(ConnectionRefusedError(), "ok")
    with pytest.raises(ConnectionRefusedError):
        send(call, tracker=tracker, rule=READ)
    assert call.calls == 1


def test_conflicts_are_started_again_as_often_as_the_rule_says(tracker):
    conflict = ConflictError("409", status_code=409)
    call = scripted(conflict, conflict, "ok")
    assert send(call, tracker=tracker, rule=RetryRule(conflicts=2), sleep=lambda s: None) == "ok"
    with pytest.raises(ConflictError):
        send(scripted(conflict, conflict, "ok"), tracker=tracker, rule=RetryRule(conflicts=1), sleep=lambda s: None)


def test_retries_stop_at_the_deadline(tracker):
    deadline = Deadline(0.05)
    slept: List[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        deadline.expires = 0.0  # time is up after the first pause

    with pytest.raises(ConnectionRefusedError):
        send(lambda: (_ for _ in ()).throw(ConnectionRefusedError()), tracker=tracker, rule=READ,
             deadline=deadline, sleep=sleep)
    assert len(slept) == 1 and slept[0] <= 0.05


def classified(call, tracker, deadline=None):
    return send(call, tracker=tracker, rule=READ, deadline=deadline if deadline is not None else Deadline(30),
                sleep=lambda s: None)


def test_a_backend_never_reached_is_not_an_outage(tracker, caplog):
    caplog.set_level(logging.INFO)
    call = scripted(unconnected(), "ok")
    with pytest.raises(NeverReachedError) as caught:
        classified(call, tracker)
    assert call.calls == 1 and "has not answered once" in str(caught.value)
    assert messages(caplog) == [] and not tracker.down


def test_a_backend_that_answered_once_is_ridden_out_when_it_refuses_connections(tracker):
    classified(scripted("ok"), tracker)
    call = scripted(unconnected(), unconnected(), "ok")
    assert classified(call, tracker) == "ok" and call.calls == 3


def test_a_backend_that_accepts_but_has_not_answered_yet_is_ridden_out(tracker):
    call = scripted(ConnectionResetError(), TimeoutError(), "ok")  # connected, no answer yet: not "never reached"
    assert classified(call, tracker) == "ok" and call.calls == 3


def test_refusals_right_after_an_outage_are_ridden_out_and_logged_once(tracker, caplog):
    caplog.set_level(logging.INFO)
    classified(scripted("ok"), tracker)
    call = scripted(ConnectionRefusedError(), Refused("HTTP 403"), Refused("HTTP 403"), Refused("HTTP 403"), "ok")
    assert classified(call, tracker) == "ok" and call.calls == 5
    refusing = [m for m in messages(caplog) if "answers HTTP 403 after its outage" in m]
    assert len(refusing) == 1 and not tracker.down


def test_a_refusal_that_does_not_follow_an_outage_is_raised_at_once(tracker):
    classified(scripted("ok"), tracker)
    call = scripted(Refused("HTTP 403"), "ok")
    with pytest.raises(Refused):
        classified(call, tracker)
    assert call.calls == 1


def test_a_refusal_on_first_contact_after_refused_connections_is_raised_at_once(tracker):
    tracker.answered(served=False)  # it answered 503 before, but never served a request
    call = scripted(unconnected(), Refused("HTTP 403"), "ok")
    with pytest.raises(Refused):
        classified(call, tracker)
    assert call.calls == 2


def test_refusals_after_an_outage_end_at_the_deadline(tracker):
    classified(scripted("ok"), tracker)
    deadline = Deadline(30)
    refusals = [Refused("HTTP 403") for _ in range(3)]

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
        send(scripted(ConnectionRefusedError()), tracker=tracker, rule=READ)
    with pytest.raises(BackendUnavailableError) as caught:
        send(scripted(Refused("HTTP 403")), tracker=tracker, rule=READ)
    assert isinstance(caught.value, TransientError) and tracker.down
    assert "the test server answered HTTP 403 right after its outage" in str(caught.value)


def test_refusals_past_the_warmup_window_are_a_missing_permission(tracker, clock, caplog):
    """The window runs from the first refusal after the outage, not from the last refused connection:
    a server back and answering 403 for WARMUP_WINDOW seconds is refusing this caller, and says so at once."""
    caplog.set_level(logging.INFO)
    classified(scripted("ok"), tracker)
    tracker.failed("ConnectionRefusedError")

    def refuse() -> None:  # one read without a deadline, as a connector's poll makes
        send(scripted(Refused("HTTP 403")), tracker=tracker, rule=READ)

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
