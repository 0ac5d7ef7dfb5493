"""Deck rendering: the worker plot and worker-seconds by tier, from a controlled clock."""
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
    assert timeline.worker_seconds_by_tier() == {UNLABELLED_TIER: 0.0, "GPU": 40.0, "Small": 8.0}


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
