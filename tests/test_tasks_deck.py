"""Deck rendering: the worker plot and worker-seconds by tier, from a controlled clock."""
import re

from flytekitplugins_ddlscale._core.deck import render_html, render_svg
from flytekitplugins_ddlscale._core.timeline import UNLABELLED_TIER, Sample, WorkerTimeline
from tests.clock_support import Clock


def test_worker_seconds_hold_each_count_until_the_next_sample():
    clock = Clock(100.0)
    timeline = WorkerTimeline(clock=clock)
    timeline.add(0, None, seconds=0.0)
    timeline.add(4, "GPU", seconds=2.0)
    timeline.add(1, "Small", seconds=12.0)
    clock.now = 120.0
    timeline.finish()
    assert timeline.duration == 20.0
    # The first sample names no tier: it counts on the tier the change went to (GPU).
    assert timeline.worker_seconds_by_tier() == {"GPU": 40.0, "Small": 8.0}


def test_a_wait_s_unlabelled_samples_count_on_the_tier_the_change_went_to():
    clock = Clock(100.0)
    timeline = WorkerTimeline(clock=clock)
    timeline.add(1, None, seconds=0.0)  # progress of a wait: no tier
    timeline.add(2, "Small", seconds=3.0)  # the state at its end names the tier
    timeline.add(1, None, seconds=5.0)  # a later wait that never named its tier
    clock.now = 107.0
    timeline.finish()
    assert timeline.worker_seconds_by_tier() == {"Small": 7.0, UNLABELLED_TIER: 2.0}
    assert timeline.tiers_used() == [UNLABELLED_TIER, "Small"] and timeline.last_tier() == "Small"


def test_samples_are_ordered_by_time_whatever_the_insertion_order():
    timeline = WorkerTimeline(clock=Clock(100.0))
    timeline.add(3, seconds=5.0)
    timeline.add(1, seconds=0.0)
    assert [s.seconds for s in timeline.samples] == [0.0, 5.0]


def test_svg_is_a_step_plot_scaled_to_the_peak():
    svg = render_svg([Sample(0.0, 0), Sample(1.0, 4), Sample(3.0, 2)], duration=4.0, width=248, height=152)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    points = svg.split('points="')[1].split('"')[0].split()
    # Each sample gives a horizontal segment: y equal within a pair, x equal across a step.
    ys = [float(p.split(",")[1]) for p in points]
    xs = [float(p.split(",")[0]) for p in points]
    assert ys[0] == ys[1] and ys[2] == ys[3] and xs[1] == xs[2]
    assert min(ys) == 16.0  # the peak (4 workers) touches the top of the plot area
    assert ">4<" in svg and "4.0s" in svg


def test_html_escapes_facts_and_lists_tiers():
    clock = Clock(100.0)
    timeline = WorkerTimeline(clock=clock)
    timeline.add(2, "<b>tier</b>", seconds=0.0)
    clock.now += 5.0
    page = render_html("Scale <x>", timeline, {"cluster": "dask/<x>"})
    assert "<b>tier</b>" not in page and "&lt;b&gt;tier&lt;/b&gt;" in page
    assert "dask/&lt;x&gt;" in page and "Scale &lt;x&gt;" in page


def test_empty_timeline_renders_without_a_line():
    assert "<polyline" not in render_svg([], duration=0.0)


def test_facts_show_what_is_known_instead_of_blanks():
    clock = Clock(100.0)
    timeline = WorkerTimeline(clock=clock)
    timeline.add(0, None, seconds=0.0)
    timeline.add(2, "Small", seconds=0.0)
    facts = {"worker_hw_tier": "", "readiness": "", "waited": False, "ready_workers": -1, "note": ""}
    page = render_html("Cluster scaling: up", timeline, facts)
    cells = dict(re.findall(r"<th style='text-align:left'>([^<]*)</th><td>([^<]*)</td>", page))
    assert cells == {
        "worker_hw_tier": "Small (the cluster&#x27;s; none asked for)",
        "readiness": "not checked (not waited for)",
        "waited": "False",
        "ready_workers": "not observable by this backend",
        "note": "-",
    }


def test_workers_the_plot_shows_are_listed_even_when_they_were_up_for_no_time():
    clock = Clock(100.0)
    timeline = WorkerTimeline(clock=clock)
    timeline.add(0, None, seconds=0.0)
    timeline.add(2, "Small", seconds=0.0)  # the node ended as its workers came
    timeline.finish()
    page = render_html("Cluster scaling: up", timeline, {})
    assert "no workers were up" not in page and "<td>Small</td><td>&lt; 0.1</td>" in page
    quiet = WorkerTimeline(clock=clock)
    quiet.add(0, "Small", seconds=0.0)
    assert "no workers were up" in render_html("Cluster wait: w", quiet, {})


def _in_a_task(mode):
    """A task's context as flytekit's ``dispatch_execute`` builds it: its parameters made from the
    run's (``outer``), sharing the run's list of Decks."""
    from flytekit.core.context_manager import ExecutionParameters, FlyteContextManager

    ctx = FlyteContextManager.current_context()
    outer = ExecutionParameters.new_builder(ctx.user_space_params).build()
    inner = outer.with_enable_deck(enable_deck=True).build()
    state = ctx.new_execution_state().with_params(mode=mode, user_space_params=inner)
    return FlyteContextManager.with_context(ctx.with_execution_state(state)), outer, inner


def test_in_a_local_run_a_task_s_deck_is_its_first_tab_and_stays_out_of_later_tasks():
    from flytekit import Deck
    from flytekit.core.context_manager import ExecutionState

    from flytekitplugins_ddlscale._core import deck as deck_module

    context, outer, inner = _in_a_task(ExecutionState.Mode.LOCAL_WORKFLOW_EXECUTION)
    listing = deck_module._listing
    try:
        with context:
            earlier = Deck("Input", "<p>an earlier task's</p>")  # in the run's shared list
            published = deck_module.publish_deck("Cluster wait", "<h2>Cluster wait: w</h2>")
            assert inner.decks[0] is published and earlier in inner.decks
        assert published not in outer.decks  # a later task, built from the run's list, does not show it
    finally:
        deck_module._listing = listing


def test_in_a_task_pod_the_deck_goes_first_in_the_list_flytekit_writes_the_file_from():
    from flytekit import Deck
    from flytekit.core.context_manager import ExecutionState

    from flytekitplugins_ddlscale._core.deck import publish_deck

    context, outer, inner = _in_a_task(ExecutionState.Mode.TASK_EXECUTION)
    with context:
        Deck("Timeline", "<p>flytekit's</p>")
        published = publish_deck("Cluster scaling", "<h2>Cluster scaling: s</h2>")
    # The pod's entrypoint writes the Deck file from the run's parameters: the same list.
    assert outer.decks is inner.decks and outer.decks[0] is published
