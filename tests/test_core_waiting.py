"""Poll schedules: fast while most changes land, slower than fixed polling afterwards."""
import itertools

from flytekitplugins_ddlscale.waiting import Backoff, TwoStageBackoff


def test_two_stage_backoff_doubles_to_fast_then_holds_slow_after_fast_until():
    steps = list(itertools.islice(TwoStageBackoff(initial=0.25, fast=1.0, fast_until=10.0, slow=3.0).intervals(), 16))
    assert steps[:4] == [0.25, 0.5, 1.0, 1.0]
    fast = list(itertools.takewhile(lambda s: s <= 1.0, steps))
    assert sum(fast[:-1]) < 10.0 <= sum(fast)
    assert set(steps[len(fast):]) == {3.0}


def test_two_stage_backoff_sends_fewer_polls_than_fixed_two_second_polling_over_a_minute():
    slept, polls = 0.0, 0
    for step in TwoStageBackoff(slow=3.0).intervals():
        if slept >= 60.0:
            break
        slept += step
        polls += 1
    assert polls <= 60 / 2.0


def test_backoff_is_geometric_and_capped():
    steps = list(itertools.islice(Backoff(initial=0.1, factor=2.0, cap=0.5).intervals(), 5))
    assert steps == [0.1, 0.2, 0.4, 0.5, 0.5]
