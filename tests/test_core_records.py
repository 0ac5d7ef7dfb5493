"""Baseline and claim encodings and the largest-claim rule."""
import datetime

from flytekitplugins_ddlscale import Baseline, ClusterState
from flytekitplugins_ddlscale.records import (
    Claim,
    decode_baseline,
    decode_claims,
    encode_baseline,
    encode_claims,
    largest_claim,
)


def test_baseline_round_trip_from_state():
    state = ClusterState("ray/r", "Running", 2, 2, autoscaling_min=1, autoscaling_max=5, worker_hw_tier="t1")
    baseline = Baseline.from_state(state)
    again = decode_baseline(encode_baseline(baseline))
    assert again == baseline and again.recorded_at.tzinfo is not None
    assert decode_baseline(None) is None and decode_baseline("") is None


def test_claims_round_trip_and_largest_with_oldest_tie():
    early = Claim("a", 3, created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc).isoformat())
    late = Claim("b", 3, created_at=datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc).isoformat())
    small = Claim("c", 1)
    claims = {"b": late, "a": early, "c": small}
    assert decode_claims(encode_claims(claims)) == claims
    assert largest_claim(claims).claim_id == "a"
    assert largest_claim({}) is None and decode_claims(None) == {}
    assert ":" in small.holder
