"""Poll schedules: fast while most changes land, slower than fixed polling afterwards."""
import itertools

from flytekitplugins_ddlscale._core.waiting import Backoff, TwoStageBackoff


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


def test_a_sub_second_timeout_is_named_as_it_was_given():
    from flytekitplugins_ddlscale.errors import ScalingTimeoutError
    from flytekitplugins_ddlscale.models import ClusterState
    from flytekitplugins_ddlscale._core.waiting import Awaited, Pacing, poll_until

    state = ClusterState(cluster="dask/c", status="Starting", desired_workers=2, existing_workers=0,
                         ready_workers=0, head_ready=True)
    try:
        poll_until(lambda: state, Awaited("2 workers", 2, lambda s: 0, lambda s: False), 0.3,
                   pacing=Pacing(Backoff(initial=0.05, factor=1.0, cap=0.05)))
    except ScalingTimeoutError as error:
        assert "timed out after 0.3s waiting for 2 workers" in str(error)
    else:
        raise AssertionError("poll_until returned although its condition never held")


def test_seconds_reads_as_given_to_a_tenth():
    from flytekitplugins_ddlscale._core.progress import seconds

    assert [seconds(900), seconds(4.94), seconds(0.5), seconds(30.0)] == ["900s", "4.9s", "0.5s", "30s"]
