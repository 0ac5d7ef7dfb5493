"""Baseline and claim encodings (the decisions on them: tests/internals/test_core_claimrules.py)."""
import datetime
import json
from pathlib import Path

import pytest

from flytekitplugins_ddlscale import Baseline, ClusterState, CorruptRecordError, InvalidInputError
from flytekitplugins_ddlscale._core.records import (
    Claim,
    decode_baseline,
    decode_claims,
    encode_baseline,
    encode_claims,
)


def test_baseline_round_trip_from_state():
    state = ClusterState("ray/r", "Running", 2, 2, autoscaling_min=1, autoscaling_max=5, worker_hw_tier="t1")
    baseline = Baseline.from_state(state)
    again = decode_baseline(encode_baseline(baseline))
    assert again == baseline and again.recorded_at.tzinfo is not None
    assert decode_baseline(None) is None and decode_baseline("") is None


def test_claims_round_trip():
    early = Claim("a", 3, created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc).isoformat())
    late = Claim("b", 3, created_at=datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc).isoformat())
    small = Claim("c", 1)
    claims = {"b": late, "a": early, "c": small}
    assert decode_claims(encode_claims(claims)) == claims
    assert decode_claims(None) == {}
    assert ":" in small.holder


_GOOD_BASELINE = {"cluster": "ray/r", "replicas": 2, "recorded_at": "2026-01-31T12:00:00+00:00"}
_GOOD_CLAIM = {"claim_id": "p", "replicas": 2, "created_at": "2026-01-31T12:00:00+00:00", "holder": "h:1"}


@pytest.mark.parametrize(
    "change, field, value",
    [
        ({"replicas": -5}, "baseline.replicas", -5),
        ({"replicas": "abc"}, "baseline.replicas", "abc"),
        ({"replicas": 1000000000}, "baseline.replicas", 1000000000),
        ({"replicas": True}, "baseline.replicas", True),
        ({"worker_hw_tier": ""}, "baseline.worker_hw_tier", ""),
        ({"autoscaling_max": -1}, "baseline.autoscaling_max", -1),
        ({"recorded_at": "yesterday"}, "baseline.recorded_at", "yesterday"),
        ({"surprise": 1}, "baseline.surprise", 1),
    ],
)
def test_a_baseline_with_a_value_user_input_could_not_give_is_refused(change, field, value):
    with pytest.raises(CorruptRecordError) as caught:
        decode_baseline(json.dumps({**_GOOD_BASELINE, **change}), source="the-file")
    error = caught.value
    assert (error.source, error.field, error.value, error.code) == ("the-file", field, value, "corrupt_record")
    assert "the-file" in str(error) and "allowed:" in str(error) and isinstance(error, InvalidInputError)


@pytest.mark.parametrize(
    "text, field, value",
    [
        (json.dumps({"p": {**_GOOD_CLAIM, "replicas": -5}}), "claims['p'].replicas", -5),
        (json.dumps({"p": {**_GOOD_CLAIM, "replicas": "abc"}}), "claims['p'].replicas", "abc"),
        (json.dumps({"p": {**_GOOD_CLAIM, "claim_id": "q"}}), "claims['p'].claim_id", "q"),
        (json.dumps({"p": {**_GOOD_CLAIM, "worker_hw_tier": 7}}), "claims['p'].worker_hw_tier", 7),
        (json.dumps({"p": 3}), "claims['p']", 3),
        ("[1, 2]", "claims", "[1, 2]"),
    ],
)
def test_claims_with_a_value_user_input_could_not_give_are_refused(text, field, value):
    with pytest.raises(CorruptRecordError) as caught:
        decode_claims(text, source="the-file")
    assert (caught.value.field, caught.value.value) == (field, value)


@pytest.mark.parametrize(
    "text, field",
    [
        (json.dumps({"a b": {**_GOOD_CLAIM, "claim_id": "a b"}}), "claims"),
        (json.dumps({"p": {**_GOOD_CLAIM, "holder": "host"}}), "claims['p'].holder"),
        (json.dumps({"p": {**_GOOD_CLAIM, "holder": "a b:12"}}), "claims['p'].holder"),
        (json.dumps({"p": {**_GOOD_CLAIM, "renewed_at": "soon"}}), "claims['p'].renewed_at"),
        (json.dumps({"p": {**_GOOD_CLAIM, "lease_seconds": 0}}), "claims['p'].lease_seconds"),
        (json.dumps({"p": {**_GOOD_CLAIM, "lease_seconds": True}}), "claims['p'].lease_seconds"),
        (json.dumps({"p": {**_GOOD_CLAIM, "lease_seconds": 10**9}}), "claims['p'].lease_seconds"),
    ],
)
def test_claim_ids_holders_and_leases_are_checked_as_records(text, field):
    with pytest.raises(CorruptRecordError) as caught:
        decode_claims(text, source="the-file")
    assert caught.value.field == field


def test_a_claim_written_before_leases_counts_from_when_it_was_made():
    from flytekitplugins_ddlscale._core.leases import DEFAULT_LEASE_SECONDS, split_live

    old = decode_claims(json.dumps({"p": _GOOD_CLAIM}))["p"]
    assert old.renewed_at == old.created_at and old.lease_seconds == DEFAULT_LEASE_SECONDS
    live, dead = split_live({"p": old})
    assert live == {} and "lease of 90s ran out" in dead["p"][1]


def test_a_claim_of_a_process_gone_from_this_host_is_dead_at_once():
    import os
    import socket
    import subprocess
    import sys

    from flytekitplugins_ddlscale._core.leases import split_live

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    mine = Claim("mine", 2)
    theirs = Claim("theirs", 3, holder=f"{socket.gethostname()}:{gone.pid}")
    elsewhere = Claim("elsewhere", 3, holder=f"another-host:{gone.pid}")
    live, dead = split_live({"mine": mine, "theirs": theirs, "elsewhere": elsewhere})
    assert sorted(live) == ["elsewhere", "mine"] and mine.holder.endswith(f":{os.getpid()}")
    assert dead["theirs"][1] == f"its holder process {theirs.holder} is gone"


def _now_plus(seconds: float) -> str:
    return (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)).isoformat()


@pytest.mark.parametrize(
    "renewed_at",
    ["2999-01-01T00:00:00+00:00", "9999-12-31T23:59:59+00:00", "9999-12-31T23:59:59-12:00", "later"],
)
def test_a_renewal_further_ahead_than_its_lease_is_a_corrupt_record_naming_the_field(renewed_at):
    text = json.dumps({"p": {**_GOOD_CLAIM, "renewed_at": renewed_at, "lease_seconds": 90}})
    with pytest.raises(CorruptRecordError) as caught:
        decode_claims(text, source="the-file")
    assert caught.value.field == "claims['p'].renewed_at" and "\n" not in str(caught.value)


def test_a_claim_time_ahead_within_its_lease_is_clock_skew_and_read():
    text = json.dumps({"p": {**_GOOD_CLAIM, "created_at": _now_plus(5), "renewed_at": _now_plus(5)}})
    read = decode_claims(text)["p"]
    assert datetime.datetime.fromisoformat(read.renewed_at) > datetime.datetime.now(datetime.timezone.utc)
    ahead = json.dumps({"p": {**_GOOD_CLAIM, "created_at": _now_plus(200), "lease_seconds": 90}})
    with pytest.raises(CorruptRecordError) as caught:
        decode_claims(ahead)
    assert caught.value.field == "claims['p'].created_at"


def test_a_lease_longer_than_a_phase_may_ask_for_is_refused():
    from flytekitplugins_ddlscale._core.leases import MAX_LEASE_SECONDS
    from flytekitplugins_ddlscale._services.hold.settings import PhaseSettings

    with pytest.raises(CorruptRecordError) as caught:
        decode_claims(json.dumps({"p": {**_GOOD_CLAIM, "lease_seconds": 86400}}))
    assert caught.value.field == "claims['p'].lease_seconds"
    with pytest.raises(InvalidInputError):
        PhaseSettings("dask/x", 1, lease_seconds=86400)
    # The bound of records is the bound of what a phase may ask for.
    assert PhaseSettings("dask/x", 1, lease_seconds=MAX_LEASE_SECONDS).lease_seconds == MAX_LEASE_SECONDS
    assert decode_claims(json.dumps({"p": {**_GOOD_CLAIM, "lease_seconds": MAX_LEASE_SECONDS}}))


def test_a_claim_of_a_live_unrelated_process_holds_only_with_its_start_time_and_lease():
    import os
    import socket

    from flytekitplugins_ddlscale._core.leases import process_start, split_live

    from flytekitplugins_ddlscale.backends.local._dask_watch import _process_start as watch_start

    parent = os.getppid()  # alive, and not this process
    holder = f"{socket.gethostname()}:{parent}"
    # What records written before psutil hold: field 22 of /proc/<pid>/stat. Both restatements of the rule agree.
    by_hand = int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert process_start(parent) == watch_start(parent) == by_hand
    recorded = Claim("recorded", 2, holder=holder, holder_start=by_hand)
    reused = Claim("reused", 2, holder=holder, holder_start=by_hand + 1)
    unknown = Claim("unknown", 2, holder=holder, holder_start=None)
    live, dead = split_live({"recorded": recorded, "reused": reused, "unknown": unknown})
    assert sorted(live) == ["recorded", "unknown"]
    assert dead["reused"][1] == f"its holder process {holder} is gone"
    # A record without a start time (written by an earlier version) is read; only its lease keeps it.
    old = decode_claims(json.dumps({"p": {**_GOOD_CLAIM, "holder": holder, "renewed_at": _now_plus(-100)}}))["p"]
    assert old.holder_start is None
    assert "lease of 90s ran out" in split_live({"p": old})[1]["p"][1]
    mine = decode_claims(encode_claims({"m": Claim("m", 1)}))["m"]
    assert mine.holder_start == process_start(os.getpid()) is not None


def test_what_a_dead_claim_held_is_said_with_its_kind_of_holder_and_since_when():
    import socket
    import subprocess
    import sys

    from flytekitplugins_ddlscale._core.leases import dead_text

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    killed = Claim("run-0a1b", 3, holder=f"{socket.gethostname()}:{gone.pid}", renewed_at="2026-12-01T10:00:00+00:00")
    assert dead_text(killed) == "3 held by a run that is gone since 2026-12-01T10:00:00+00:00"
    stalled = Claim("phase-9f", 2, lease_seconds=90, renewed_at="2026-12-01T10:00:00+00:00")
    assert dead_text(stalled) == (
        "2 held by a phase that stopped renewing at 2026-12-01T10:00:00+00:00 (its lease of 90s ran out)"
    )
