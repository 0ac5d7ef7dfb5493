"""The error families: each class sits in its family, a caller catching the family gets it, codes and
pickling stay, and retrying is decided by the transient family alone (a never reached backend is not
transient: it fails at once, where an outage of a reached backend is ridden out)."""
import logging
import pickle

import pytest

from flytekitplugins_ddlscale import (
    AccessError,
    BackendUnavailableError,
    CapacityExceededError,
    ClusterFaultError,
    ClusterNotFoundError,
    ClusterStateError,
    ConflictError,
    CorruptRecordError,
    InterruptedChangeError,
    InvalidInputError,
    NeverReachedError,
    NotScalableError,
    ScalingError,
    ScalingTimeoutError,
    StateWriteError,
    TransientError,
    UnauthorizedError,
    UnconfirmedChangeError,
    UnknownTierError,
    UnreachableWaitError,
    UnsafePathError,
    UnsupportedOperationError,
    WorkerFailedError,
)
from flytekitplugins_ddlscale._core import outage
from flytekitplugins_ddlscale._core.outage import OutageTracker, RetryRule, send
from flytekitplugins_ddlscale._core.waiting import Backoff, Deadline
from flytekitplugins_ddlscale.backends._support.domino_auth import ProxyUnavailableError
from flytekitplugins_ddlscale.backends.kubernetes._api import Conflict, WatchExpired
from flytekitplugins_ddlscale.backends.local._supervisor import HeadExitedError
from flytekitplugins_ddlscale._services.connector_policy import NotServedError

# One instance of every class, built as the code builds it, with the family it must be caught by.
MEMBERS = [
    (InvalidInputError("replicas", -1, "0..100"), InvalidInputError, "invalid_input"),
    (CorruptRecordError("cluster.json", "port", "x", "1..65535"), InvalidInputError, "corrupt_record"),
    (UnsafePathError("/tmp/s", "group-writable", "chmod 700 it"), InvalidInputError, "unsafe_state_dir"),
    (UnreachableWaitError(5, desired=2, maximum=4, cluster="ray/x"), InvalidInputError, "unreachable_wait"),
    (UnknownTierError("unknown worker_hw_tier='big'", field="worker_hw_tier", value="big", allowed="small"),
     InvalidInputError, "invalid_hw_tier"),
    (NotServedError("backend", "local", "scaler, kubernetes"), InvalidInputError, "not_served"),
    (ClusterNotFoundError("gone"), ClusterStateError, "not_found"),
    (NotScalableError("no autoscaling"), ClusterStateError, "not_scalable"),
    (CapacityExceededError("above max"), ClusterStateError, "capacity_exceeded"),
    (UnsupportedOperationError("mpi head"), ClusterStateError, "unsupported"),
    (ConflictError("kept changing"), ClusterStateError, "conflict"),
    (Conflict("409"), ClusterStateError, "conflict"),
    (InterruptedChangeError("half-way", path="/s/cluster.json"), ClusterStateError, "interrupted_change"),
    (UnconfirmedChangeError("may have been sent"), ClusterStateError, "unconfirmed_change"),
    (WorkerFailedError("crash", pod="w-1", reason="CrashLoopBackOff"), ClusterStateError, "pod_failed"),
    (ClusterFaultError("head lost"), ClusterStateError, "cluster_fault"),
    (StateWriteError("/s/cluster.json", "read-only"), ClusterStateError, "state_unwritable"),
    (BackendUnavailableError("503"), TransientError, "backend_unavailable"),
    (ProxyUnavailableError("proxy 503"), TransientError, "backend_unavailable"),
    (HeadExitedError("head exited"), TransientError, "backend_unavailable"),
    (WatchExpired("410"), TransientError, "watch_expired"),
    (ScalingTimeoutError("timed out"), ScalingTimeoutError, "timeout"),
    (UnauthorizedError("403"), AccessError, "unauthorized"),
    (NeverReachedError("refused, never answered"), AccessError, "backend_unavailable"),
]
FAMILIES = (InvalidInputError, ClusterStateError, TransientError, ScalingTimeoutError, AccessError)


@pytest.mark.parametrize("error, family, code", MEMBERS, ids=lambda value: type(value).__name__)
def test_each_error_is_caught_by_its_family_and_no_other(error, family, code):
    with pytest.raises(family):
        raise error
    assert [f for f in FAMILIES if isinstance(error, f)] == [family]
    assert isinstance(error, ScalingError) and error.code == code
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.code == code


def test_bad_input_is_still_a_value_error():
    assert all(isinstance(error, ValueError) for error, family, _ in MEMBERS if family is InvalidInputError)


def test_an_unknown_tier_names_its_field_like_other_bad_input(tmp_path):
    from flytekitplugins_ddlscale.backends.tiers import FileTierCatalog
    from tests.servers.k8s_fixtures import TIERS_YAML

    path = tmp_path / "tiers.yaml"
    path.write_text(TIERS_YAML, encoding="utf-8")
    catalog = FileTierCatalog(path)
    with pytest.raises(InvalidInputError) as caught:
        catalog.resolve("no-such-tier", "ray", field="head_hw_tier")
    assert isinstance(caught.value, UnknownTierError)
    allowed = sorted(t.name for t in catalog.tiers() if t.allows("ray"))
    assert (caught.value.field, caught.value.value, caught.value.allowed) == (
        "head_hw_tier", "no-such-tier", ", ".join(allowed)
    )


def test_never_reached_is_an_access_error_not_a_transient_one():
    """It used to subclass BackendUnavailableError, so every ride-out needed a guard in front of it."""
    assert not issubclass(NeverReachedError, (TransientError, BackendUnavailableError))
    assert outage.NeverReachedError is NeverReachedError  # still importable where it was


def _tracker() -> OutageTracker:
    return OutageTracker("the test backend", logging.getLogger("test"))


def _attempts(failures, tracker, timeout=5.0):
    """Run :func:`send` (a read inside a wait) on a call that raises ``failures`` in turn, then answers "ok"."""
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return "ok"

    rule = RetryRule(ride_out=True, outage_backoff=Backoff(0.001, 1.0, 0.001))
    result = send(call, tracker=tracker, rule=rule, deadline=Deadline(timeout), sleep=lambda seconds: None)
    return result, len(calls)


def _refused():
    import httpx

    return httpx.ConnectError("refused")


def test_a_backend_never_reached_fails_at_once_with_an_access_error():
    with pytest.raises(AccessError) as caught:
        _attempts([_refused()] * 3, _tracker())
    assert isinstance(caught.value, NeverReachedError) and not isinstance(caught.value, TransientError)


def test_a_reached_backend_that_goes_down_is_ridden_out():
    tracker = _tracker()
    assert _attempts([], tracker) == ("ok", 1)
    assert _attempts([_refused()] * 3, tracker) == ("ok", 4)
