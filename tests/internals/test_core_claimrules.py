"""The claim and baseline rules both stores apply (``_core/claimrules.py``), on plain values."""
import datetime

from flytekitplugins_ddlscale import Baseline
from flytekitplugins_ddlscale._core import claimrules
from flytekitplugins_ddlscale._core.claimrules import ClusterRecords, RecordChange, Size
from flytekitplugins_ddlscale._core.records import Claim

NOW = datetime.datetime(2026, 6, 1, 12, 0, tzinfo=datetime.timezone.utc)
HOLDER = "another-host:1"
"""A holder on no host of these tests, so only its lease decides whether its claim is live."""


def at(minutes: float) -> str:
    return (NOW + datetime.timedelta(minutes=minutes)).isoformat()


def claim(claim_id: str, replicas: int, made: float = -1.0, renewed: float = -0.5, tier=None) -> Claim:
    """A claim made ``made`` minutes from NOW and renewed at ``renewed``, with a one-minute lease."""
    return Claim(claim_id, replicas, tier, HOLDER, at(made), at(renewed), 60.0)


def size(replicas: int, tier=None) -> Baseline:
    return Baseline("ray/r", replicas, worker_hw_tier=tier, recorded_at=NOW)


def same_name(name, observed):
    return name == observed


def test_the_largest_live_claim_wins_and_a_tie_goes_to_the_claim_made_first():
    claims = {"late": claim("late", 3, made=-1), "early": claim("early", 3, made=-5), "small": claim("small", 1)}
    assert claimrules.largest_claim(claims).claim_id == "early"
    assert claimrules.largest_claim({}) is None
    lapsed = claim("lapsed", 9, renewed=-2)
    assert claimrules.live_claims({**claims, "lapsed": lapsed}, NOW) == claims


def test_the_first_claim_records_the_baseline_and_the_size_outside_phases():
    change, largest = claimrules.claim(ClusterRecords(), claim("a", 2), NOW)
    assert (change.baseline, change.outside, set(change.claims), largest.claim_id) == (
        Size.RECORD, Size.RECORD, {"a"}, "a"
    )


def test_a_claim_beside_a_live_phase_keeps_the_sizes_recorded_and_drops_dead_claims():
    lapsed = claim("lapsed", 9, renewed=-2)
    records = ClusterRecords({"b": claim("b", 4), "lapsed": lapsed}, size(1), size(2))
    change, largest = claimrules.claim(records, claim("a", 2), NOW)
    assert (change.baseline, change.outside) == (Size.KEEP, Size.KEEP)
    assert set(change.claims) == {"a", "b"} and dict(change.dead) == {"lapsed": (lapsed, change.dead["lapsed"][1])}
    assert "lease of 60s ran out" in change.dead["lapsed"][1] and largest.claim_id == "b"


def test_a_claim_whose_only_other_claims_are_dead_is_the_first_phase():
    records = ClusterRecords({"lapsed": claim("lapsed", 9, renewed=-2)}, size(1), None)
    change, _ = claimrules.claim(records, claim("a", 2), NOW)
    assert change.outside is Size.RECORD and set(change.claims) == {"a"}


def test_a_phase_claiming_again_keeps_when_its_live_claim_was_made():
    records = ClusterRecords({"a": claim("a", 2, made=-10), "b": claim("b", 5, made=-3)}, size(1), size(1))
    change, largest = claimrules.claim(records, claim("a", 5, made=0, renewed=0, tier="big"), NOW)
    again = change.claims["a"]
    assert (again.replicas, again.worker_hw_tier, again.created_at, again.renewed_at) == (5, "big", at(-10), at(0))
    assert largest.claim_id == "a"  # a tie with "b", made later
    # A lapsed claim of the same id is another phase's: the new claim counts from now.
    lapsed = ClusterRecords({"a": claim("a", 2, made=-10, renewed=-2)}, size(1), None)
    change, _ = claimrules.claim(lapsed, claim("a", 2, made=0, renewed=0), NOW)
    assert change.claims["a"].created_at == at(0) and "a" in change.dead


def test_a_renewal_moves_the_lease_and_keeps_when_the_claim_was_made():
    claims = {"a": claim("a", 2, made=-10, renewed=-0.5), "b": claim("b", 1)}
    change, renewed = claimrules.renew(claims, "a")
    assert renewed.created_at == at(-10) and renewed.renewed_at > at(-0.5) and change.claims["a"] == renewed
    assert change.claims["b"] == claims["b"] and (change.baseline, change.outside) == (Size.KEEP, Size.KEEP)
    assert claimrules.renew(claims, "gone") == (RecordChange(), None)


def test_a_lapsed_claim_its_holder_renews_before_it_is_dropped_counts_again():
    lapsed = claim("a", 3, made=-10, renewed=-5)  # its one-minute lease ran out four minutes before NOW
    assert claimrules.live_claims({"a": lapsed}, NOW) == {}
    change, renewed = claimrules.renew({"a": lapsed}, "a")  # a hung holder woke up before any drop
    assert renewed.created_at == at(-10) and claimrules.live_claims(change.claims) == {"a": renewed}
    dropped, _ = claimrules.release({"a": lapsed}, "a")
    assert claimrules.renew(dropped.claims, "a") == (RecordChange(), None)  # once dropped, it stays gone


def test_a_release_drops_only_its_claim_and_answers_the_largest_live_one_left():
    lapsed = claim("lapsed", 9, renewed=-2)
    claims = {"a": claim("a", 3), "b": claim("b", 2), "lapsed": lapsed}
    change, largest = claimrules.release(claims, "a", NOW)
    assert change.claims == {"b": claims["b"], "lapsed": lapsed} and largest.claim_id == "b"
    change, largest = claimrules.release({"a": claim("a", 3)}, "a", NOW)
    assert change.claims == {} and change.writes and largest is None
    change, largest = claimrules.release(claims, "absent", NOW)
    assert not change.writes and largest.claim_id == "a"


def test_a_restore_ends_every_phase_and_forgets_both_sizes():
    records = ClusterRecords({"b": claim("b", 2), "a": claim("a", 9, renewed=-2)}, size(1), size(2))
    change, dropped = claimrules.restore(records)
    assert (change.claims, change.baseline, change.outside, dropped) == ({}, Size.FORGET, Size.FORGET, ["a", "b"])
    assert claimrules.restore(ClusterRecords()) == (RecordChange(), [])
    change, _ = claimrules.restore(ClusterRecords(baseline=size(1)))
    assert (change.claims, change.baseline, change.outside) == (None, Size.FORGET, Size.KEEP)


def test_settle_holds_the_largest_claim_never_below_the_size_outside_phases_on_its_tier():
    records = ClusterRecords({"a": claim("a", 1, tier="small")}, size(0, "small"), size(4, "small"))
    decided = claimrules.settle(records, same_name, NOW)
    assert (decided.hold.claim_id, decided.replicas, decided.restore_to.replicas) == ("a", 4, 4)
    assert not decided.change.writes  # nothing dead, everything recorded: the record stays
    other_tier = ClusterRecords({"a": claim("a", 1, tier="large")}, size(0, "small"), size(4, "small"))
    assert claimrules.settle(other_tier, same_name, NOW).replicas == 1


def test_settle_drops_dead_claims_and_records_a_missing_baseline_while_holding():
    lapsed = claim("lapsed", 9, renewed=-2)
    decided = claimrules.settle(ClusterRecords({"a": claim("a", 2), "lapsed": lapsed}), same_name, NOW)
    assert decided.hold.claim_id == "a" and set(decided.dead) == {"lapsed"}
    assert (set(decided.change.claims), decided.change.baseline, decided.change.outside) == (
        {"a"}, Size.RECORD, Size.KEEP
    )


def test_settle_with_no_live_claim_puts_back_the_size_outside_phases_and_forgets_it():
    # A node changed the cluster before the phase: the baseline differs and is kept for RestoreCluster.
    kept = claimrules.settle(ClusterRecords({}, size(0), size(2)), same_name, NOW)
    assert (kept.hold, kept.replicas, kept.restore_to.replicas) == (None, 0, 2)
    assert (kept.change.claims, kept.change.baseline, kept.change.outside) == (None, Size.KEEP, Size.FORGET)
    # Only phases changed it: the two are the same size, and both go.
    both = claimrules.settle(ClusterRecords({}, size(2), size(2)), same_name, NOW)
    assert (both.change.baseline, both.change.outside) == (Size.FORGET, Size.FORGET)
    # No size outside phases (a scale, then a restore's reconcile): the baseline comes back and goes.
    alone = claimrules.settle(ClusterRecords({"x": claim("x", 3, renewed=-2)}, size(1), None), same_name, NOW)
    assert alone.restore_to.replicas == 1 and alone.change.baseline is Size.FORGET
    assert alone.change.claims == {} and set(alone.dead) == {"x"}
    nothing = claimrules.settle(ClusterRecords(), same_name, NOW)
    assert nothing.restore_to is None and not nothing.change.writes
