"""What the user sees: summary lines, the progress bar on an 80-column terminal, Deck numbers, one import."""
import io
import logging
import subprocess
import sys
from dataclasses import replace

import pytest

from flytekitplugins_ddlscale._core import progress, settings
from flytekitplugins_ddlscale._core.deck import fact_text, render_html, render_svg
from flytekitplugins_ddlscale._core.progress import Activity, RichReporter, WaitProgress, begin_wait, emit_line
from flytekitplugins_ddlscale._core.summary import PhaseEnd
from flytekitplugins_ddlscale._services.nodes.restore import restore_line
from flytekitplugins_ddlscale._services.nodes.scale import scale_line
from flytekitplugins_ddlscale._services.nodes.wait import wait_line
from flytekitplugins_ddlscale.tasks import ClusterReady, RestoreOutcome, ScaleOutcome
from flytekitplugins_ddlscale._core.timeline import WorkerTimeline
from tests.clock_support import Clock

UP = ScaleOutcome(
    cluster="dask/x", backend="local", requested=2, effective=2, capped=False, previous_workers=0,
    workers=2, ready_workers=2, waited=True, seconds_waited=5.31,
)


def test_scale_summary_reads_like_the_issue_example_and_takes_a_readiness_string():
    assert scale_line("scale_up", UP) == "scale_up: dask/x 0 -> 2 workers ready in 5.3 s"
    with_readiness = replace(UP, readiness="2 registered")
    assert scale_line("scale_up", with_readiness) == (
        "scale_up: dask/x 0 -> 2 workers ready in 5.3 s (framework: 2 registered)"
    )
    # The node's own time, starting the cluster included, and how much of it was the wait.
    assert scale_line("scale_up", UP, seconds_total=9.46) == "scale_up: dask/x 0 -> 2 workers ready in 9.5 s (5.3 s waiting)"
    assert scale_line("scale_up", UP, seconds_total=5.31) == "scale_up: dask/x 0 -> 2 workers ready in 5.3 s"


@pytest.mark.parametrize(
    "changes, expected",
    [
        (dict(previous_workers=2, effective=0, workers=0, ready_workers=0, requested=0, seconds_waited=0.74),
         "down: dask/x 2 -> 0 workers in 0.7 s"),
        (dict(waited=False, ready_workers=0, seconds_waited=0.0),
         "down: dask/x 0 -> 2 workers requested, not waited for"),
        (dict(requested=8, capped=True),
         "down: dask/x 0 -> 2 workers ready in 5.3 s, capped from 8"),
        (dict(ready_workers=-1, worker_hw_tier="GPU"),
         "down: dask/x 0 -> 2 workers up (readiness not observable) on GPU in 5.3 s"),
        (dict(effective=1, workers=1, requested=1, ready_workers=1),
         "down: dask/x 0 -> 1 worker ready in 5.3 s"),
        # An autoscaler above the held size: the workers found Ready and the size the cluster wants.
        (dict(effective=3, requested=3, workers=5, ready_workers=4),
         "down: dask/x 0 -> 4 workers ready (at least 3 held; the cluster wants 5) in 5.3 s"),
    ],
)
def test_scale_summary_variants(changes, expected):
    assert scale_line("down", replace(UP, **changes)) == expected


def test_wait_restore_and_phase_summaries():
    ready = ClusterReady(cluster="dask/x", backend="local", status="Running", workers=2, ready_workers=2,
                         seconds_waited=1.04)
    assert wait_line("ready", ready) == "ready: dask/x 2 workers ready after 1.0 s"
    floor = replace(ready, workers=5, ready_workers=3)
    assert wait_line("ready", floor) == "ready: dask/x 3 workers ready (the cluster wants 5) after 1.0 s"
    restored = RestoreOutcome(cluster="dask/x", backend="local", restored="baseline", previous_workers=2,
                              workers=0, ready_workers=0, waited=True, seconds_waited=0.52)
    assert restore_line("restore", restored) == "restore: dask/x 2 -> 0 workers (baseline) in 0.5 s"
    nothing = replace(restored, restored="nothing recorded", previous_workers=0)
    assert restore_line("restore", nothing) == "restore: dask/x unchanged at 0 workers (no baseline recorded)"
    assert PhaseEnd("train", "dask/x", 10.0, (0, 4, 3.04), "0 workers (baseline)").line() == (
        "train: dask/x 0 -> 4 workers ready in 3.0 s; done after 10.0 s, restored to 0 workers (baseline)"
    )
    assert PhaseEnd("train", "dask/x", 10.0, (0, 4, 3.04), found=(5, 6)).line() == (
        "train: dask/x 0 -> 5 workers ready (at least 4 held; the cluster wants 6) in 3.0 s; done after 10.0 s"
    )
    assert PhaseEnd("train", "dask/x", 2.0, error=TimeoutError("t")).line() == (
        "train: dask/x not scaled; failed after 2.0 s (TimeoutError)"
    )


@pytest.fixture
def no_logging_handlers(monkeypatch):
    """The situation under ``pyflyte run``: nothing handles the root logger or the plugin's.

    pytest adds its capture handler when each test phase starts, so the
    test calls the returned function in its body. An earlier in-process
    ``ddlscale`` command leaves its stderr handler on the plugin's logger.
    """
    monkeypatch.delenv(settings.QUIET.name, raising=False)
    plugin = logging.getLogger("flytekitplugins_ddlscale")

    def clear() -> None:
        monkeypatch.setattr(logging.root, "handlers", [])
        monkeypatch.setattr(plugin, "handlers", [])

    return clear


def test_summary_goes_to_stderr_when_logging_is_not_configured(no_logging_handlers, capsys):
    no_logging_handlers()
    emit_line("scale_up: dask/x 0 -> 2 workers ready in 5.3 s")
    captured = capsys.readouterr()
    assert captured.err == "scale_up: dask/x 0 -> 2 workers ready in 5.3 s\n" and captured.out == ""


def test_quiet_setting_silences_summaries(no_logging_handlers, capsys, monkeypatch):
    no_logging_handlers()
    monkeypatch.setenv(settings.QUIET.name, "1")
    emit_line("anything")
    assert capsys.readouterr().err == ""


def _lines_until(capsys, seen, wanted, timeout=10.0):
    """The stderr lines written so far once ``wanted(lines)`` holds (polled; fails after ``timeout``)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        seen.extend(capsys.readouterr().err.splitlines())
        if wanted(seen):
            return seen
        assert time.monotonic() < deadline, f"not seen within {timeout}s: {seen}"
        time.sleep(0.05)


def test_a_piped_wait_says_when_it_starts_each_change_and_keeps_talking_while_nothing_changes(
    no_logging_handlers, capsys
):
    no_logging_handlers()
    reporter = progress.LogReporter(interval=0.2, activity=Activity("scale_up", "dask/x"))
    seen = []
    with reporter:
        begin_wait(reporter, 2, 60)
        reporter(WaitProgress("2 Ready workers on dask/x", 0, 2, 0.1, 60))
        _lines_until(capsys, seen, lambda lines: sum("still waiting" in line for line in lines) >= 2)
        reporter(WaitProgress("2 Ready workers on dask/x", 1, 2, 0.9, 60))
        reporter(WaitProgress("2 Ready workers on dask/x", 2, 2, 1.0, 60))
        seen.extend(capsys.readouterr().err.splitlines())
    assert seen[0] == "scale_up dask/x: waiting for 2 workers (timeout 60s)"
    assert seen[1].startswith("scale_up: waiting for 2 Ready workers on dask/x: 0/2 after 0.1s (timeout 60s)")
    assert seen[2].startswith("scale_up: still waiting for 2 Ready workers on dask/x: 0/2 after ")
    assert [line.split(": ")[-1].split(" after")[0] for line in seen[-2:]] == ["1/2", "2/2"]
    assert _heartbeats_end()


def _heartbeats_end(timeout=10.0):
    import threading
    import time

    deadline = time.monotonic() + timeout
    while any(t.name == "ddlscale-progress" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "a heartbeat thread outlived its wait"
        time.sleep(0.05)
    return True


def test_a_forgotten_wait_stops_its_heartbeat_and_quiet_silences_it(no_logging_handlers, capsys, monkeypatch):
    no_logging_handlers()
    reporter = progress.LogReporter(interval=0.2, activity=Activity("scale_up", "dask/x"))
    reporter(WaitProgress("2 Ready workers on dask/x", 0, 2, 0.1, 60))
    del reporter  # a caller that never closed it: the heartbeat holds it weakly and ends
    assert _heartbeats_end()
    monkeypatch.setenv(settings.QUIET.name, "1")
    capsys.readouterr()
    quiet = progress.LogReporter(interval=0.05)
    quiet(WaitProgress("2 Ready workers on dask/x", 0, 2, 0.1, 60))
    assert capsys.readouterr().err == ""
    quiet.close()


def test_configured_logging_receives_the_line_instead_of_stderr(no_logging_handlers, capsys, caplog):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    no_logging_handlers()
    logging.root.addHandler(Keep())
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    emit_line("via logging")
    assert [r.getMessage() for r in records] == ["via logging"]
    assert capsys.readouterr().err == ""


def _terminal():
    from rich.console import Console

    out = io.StringIO()
    return out, Console(file=out, force_terminal=True, width=80, color_system=None)


def _visible_lines(text):
    import re

    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    return [line for chunk in plain.split("\n") for line in chunk.split("\r") if line.strip()]


def test_bar_appears_when_the_wait_starts_naming_node_cluster_and_target():
    out, console = _terminal()
    cluster = "ns-long-namespace/dask/a-rather-long-cluster-name-for-80-columns"
    reporter = RichReporter(Activity("scale_and_wait", cluster), console=console)
    with reporter:
        begin_wait(reporter, 2, 300)
        shown_before_any_observation = out.getvalue()
        reporter(WaitProgress("2 workers seen by the Dask scheduler", 1, 2, 1.0, 300))
        reporter(WaitProgress("2 workers seen by the Dask scheduler", 2, 2, 2.0, 300))
    lines = _visible_lines(out.getvalue())
    assert "scale_and_wait" in shown_before_any_observation and "0/2" in shown_before_any_observation
    last_frame = max(i for i, line in enumerate(lines) if "2/2" in line)
    final = " ".join(line.strip() for line in lines[last_frame:])
    assert "scale_and_wait" in final and "done, 2 workers up" in final and "waiting for" not in final
    # A cluster name longer than the free width is folded, never cut short.
    assert cluster in "".join(line.strip() for line in lines[last_frame:])
    assert "seen" not in out.getvalue()
    assert max(len(line) for line in lines) <= 80


def test_an_error_after_a_failed_wait_starts_on_its_own_line():
    out, console = _terminal()
    with pytest.raises(RuntimeError):
        with RichReporter(Activity("scale_up", "dask/x"), console=console) as reporter:
            begin_wait(reporter, 3, 60)
            reporter(WaitProgress("3 workers", 1, 3, 1.0, 60))
            raise RuntimeError("boom")
    out.write("Error: boom\n")
    import re

    assert "\nError: boom\n" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert _visible_lines(out.getvalue())[-1] == "Error: boom"
    # The bar left on screen says where the wait stopped, not that it is still waiting.
    assert "scale_up dask/x: stopped waiting, 1 of 3 workers up" in _visible_lines(out.getvalue())[-2]


def test_a_bar_closed_before_any_observation_says_it_stopped_at_0():
    out, console = _terminal()
    with RichReporter(Activity("scale_up", "dask/x"), console=console) as reporter:
        begin_wait(reporter, 2, 60)
    assert "scale_up dask/x: stopped waiting, 0 of 2 workers up" in _visible_lines(out.getvalue())[-1]


def test_deck_numbers_are_rounded_and_unused_tiers_left_out():
    assert fact_text(0.6123) == "0.61" and fact_text(5.0) == "5.0" and fact_text(3) == "3"

    clock = Clock()
    timeline = WorkerTimeline(clock=clock)
    timeline.add(0, None, seconds=0.0)
    timeline.add(2, "Small", seconds=1.0)
    clock.now = 4.0
    page = render_html("Cluster scaling: up", timeline, {"seconds_waited": 0.6123})
    assert "<td>0.61</td>" in page and "0.6123" not in page
    assert "(default tier)" not in page and "<td>Small</td><td>6.0</td>" in page


def test_restore_is_marked_and_its_drop_stays_visible_at_the_end_of_the_plot():
    clock = Clock()
    timeline = WorkerTimeline(clock=clock)
    timeline.add(0, seconds=0.0)
    timeline.add(3, seconds=1.0)
    clock.now = 9.0
    timeline.mark("restore")
    timeline.add(0, seconds=9.0)
    timeline.finish()
    svg = render_svg(timeline.samples, timeline.duration, marks=timeline.marks)
    assert ">restore<" in svg and "stroke-dasharray" in svg
    points = [tuple(map(float, p.split(","))) for p in svg.split('points="')[1].split('"')[0].split()]
    last_segment = points[-2:]
    assert last_segment[0][1] == last_segment[1][1]  # horizontal at the restored level ...
    assert last_segment[1][0] - last_segment[0][0] > 5  # ... and wide enough to be seen


def test_distributed_phase_above_task_is_refused_showing_the_right_order():
    from flytekit import task

    from flytekitplugins_ddlscale import distributed_phase

    @task
    def body(x: int) -> int:
        return x

    with pytest.raises(TypeError) as info:
        distributed_phase(cluster="dask/x", replicas=1)(body)
    message = str(info.value)
    assert "@task\n    @distributed_phase(" in message and "def body(" in message


def test_default_task_names_are_qualified_by_module_so_two_modules_do_not_collide():
    from collections import OrderedDict

    from flytekit.configuration import Image, ImageConfig, SerializationSettings
    from flytekit.tools.translator import get_serializable

    from tests.flyte_apps import names_a, names_b

    assert names_a.scale_down.name == "tests.flyte_apps.names_a.scale_down"
    assert names_b.scale_down.name == "tests.flyte_apps.names_b.scale_down"
    assert names_a.scale_down.short_name == "scale_down"
    settings = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))
    entities = OrderedDict()
    get_serializable(entities, settings, names_b.both)
    task_names = {spec.template.id.name for spec in entities.values() if hasattr(spec, "template")
                  and getattr(spec.template, "type", "") == "ddlscale_scale"}
    assert task_names == {"tests.flyte_apps.names_a.scale_down", "tests.flyte_apps.names_b.scale_down"}


def test_root_exports_every_user_facing_name_without_importing_flytekit():
    code = (
        "import sys, flytekitplugins_ddlscale as p\n"
        "loaded = [m for m in ('flytekit', 'httpx', 'kubernetes', 'distributed', 'rich') if m in sys.modules]\n"
        "print(loaded)\n"
        "names = ['ScaleCluster', 'RestartHead', 'WaitForCluster', 'RestoreCluster', 'ScaleOutcome',\n"
        "         'RestartOutcome', 'ClusterReady', 'RestoreOutcome', 'distributed_phase', 'cluster_phase',\n"
        "         'scale_down_on_failure', 'connected']\n"
        "print(all(n in p.__all__ and getattr(p, n) is not None for n in names))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "True"]
