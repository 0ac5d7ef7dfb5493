"""Timeouts that hold and texts that are true, on real local Dask clusters.

A timeout bounds creating a cluster too (the scheduler's start is part of
the operation): a scale or a phase on a new cluster whose timeout runs out
while the scheduler starts fails with a timeout error that says what it left;
a phase that then restored the cluster says so instead of "left in place".
Outcomes and texts only: no wall-clock limits.
"""
import contextlib
from typing import Iterator

import pytest

from flytekitplugins_ddlscale.errors import ScalingTimeoutError
from flytekitplugins_ddlscale._services.hold import cluster_phase
from flytekitplugins_ddlscale.models import ReplicaSpec
from flytekitplugins_ddlscale.refs import ClusterRef
from tests.flyte_support import local_backend, local_env  # noqa: F401 - fixture

REF = ClusterRef("dask", "timeouts")


@contextlib.contextmanager
def a_head_slower_than_the_timeout(local_state) -> Iterator[None]:
    """The new scheduler's process is stopped (SIGSTOP) as soon as it is started, so the cluster cannot be up
    within any timeout of the block, however quick the machine (a start used to take longer than 0.5 s by
    itself; a quiet start no longer does). It goes on (SIGCONT) when the block ends."""
    import os
    import signal

    import psutil

    from flytekitplugins_ddlscale._core.lifetime import add_pause_hook

    stopped = []

    def stop_the_head(point: str) -> None:
        if point == "head-started" and not stopped:
            [head] = [p for p in psutil.process_iter(["cmdline"])
                      if str(local_state) in " ".join(p.info["cmdline"] or []) and "--port" in (p.info["cmdline"] or [])]
            os.kill(head.pid, signal.SIGSTOP)
            stopped.append(head.pid)

    remove = add_pause_hook(stop_the_head)
    try:
        yield
    finally:
        remove()
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):  # taken down by the block
                os.kill(pid, signal.SIGCONT)
    assert stopped, "the head was never started"


@pytest.mark.slow
def test_a_scale_creating_a_cluster_fails_at_its_timeout_and_says_what_it_left(local_env):
    backend = local_backend(local_env)
    # A creation that outlasts the timeout used to wait for the scheduler regardless (60 s at most) and
    # then succeed, seconds past the timeout.
    with a_head_slower_than_the_timeout(local_env), pytest.raises(ScalingTimeoutError) as info:
        backend.scale(REF, 4, timeout=0.5)
    error = info.value
    assert error.left_in_place == "desired_workers=4"
    assert "timeout of 0.5s ran out" in error.message
    assert "nothing was rolled back" in error.message and "ddlscale restore" in error.remedy_command
    # What it names is what is there: the workers still arrive, and the remedy removes them.
    state = backend.wait_for_workers(REF, 4, timeout=120)
    assert state.ready_workers == 4
    backend.restore_baseline(REF, timeout=120)
    assert backend.list_clusters() == []


@pytest.mark.slow
def test_a_phase_creating_a_cluster_fails_at_its_timeout_and_leaves_nothing(local_env):
    backend = local_backend(local_env)
    with a_head_slower_than_the_timeout(local_env), pytest.raises(ScalingTimeoutError) as info:
        with cluster_phase(REF, 4, timeout=0.5, deck=False):
            pytest.fail("the body must not run")
    text = str(info.value)
    assert "nothing was rolled back" not in text and "left in place:" not in text, text
    assert "the cluster was set to 0 workers (as found); nothing is left in place" in text
    assert info.value.left_in_place is None and info.value.remedy_command is None
    assert backend.list_clusters() == []


@pytest.mark.slow
def test_a_phase_timeout_after_the_restore_says_what_the_restore_set(local_env):
    """The scheduler is stopped (SIGSTOP) as soon as the first new worker starts, so none of the 6 registers
    and the scale-up runs out of its 1 s whatever the machine's speed; it resumes once the phase released its
    claim, and the restore puts back the 1 worker it found. (Racing 6 worker starts against 1 s failed once a
    fast machine registered all 6 in 0.9 s.)"""
    import os
    import signal

    from flytekitplugins_ddlscale._core.lifetime import add_pause_hook

    backend = local_backend(local_env)
    backend.up(REF, 1, timeout=120)
    backend.restore_baseline(REF, ReplicaSpec(1), timeout=120)
    scheduler = backend.store.load(REF).scheduler
    points = []

    def hold_registrations_until_released(point: str) -> None:
        if point == "worker-started" and not points:
            os.kill(scheduler.pid, signal.SIGSTOP)
            points.append(point)
        elif point == "released" and points == ["worker-started"]:
            os.kill(scheduler.pid, signal.SIGCONT)
            points.append(point)

    remove = add_pause_hook(hold_registrations_until_released)
    try:
        with pytest.raises(ScalingTimeoutError) as info:
            with cluster_phase(REF, 6, timeout=1, deck=False):
                pytest.fail("the body must not run")
    finally:
        remove()
        os.kill(scheduler.pid, signal.SIGCONT)
    assert points == ["worker-started", "released"], points
    text = str(info.value)
    assert "desired_workers=6 left in place" not in text and "nothing was rolled back" not in text, text
    assert "The change (desired_workers=6) was then undone: the cluster was set to 1 worker (as found)" in text
    assert backend.get_state(REF).desired_workers == 1


@pytest.mark.slow
def test_every_check_of_a_hung_scheduler_is_cut_to_what_is_left_of_the_timeout(local_env, caplog):
    """The scheduler is stopped (SIGSTOP): it accepts connections and never answers. Each check of it
    used to be a 3 s attempt whatever the operation had left (``up --timeout 2`` took 7.4 s); now every
    attempt gets at most what is left of the 2 s (0.5 s each once it is spent: the final read)."""
    import logging
    import os
    import re
    import signal

    backend = local_backend(local_env)
    backend.up(REF, 1, timeout=120)
    scheduler = backend.store.load(REF).scheduler
    os.kill(scheduler.pid, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.DEBUG, logger="flytekitplugins_ddlscale"), pytest.raises(ScalingTimeoutError) as info:
            backend.up(REF, 2, timeout=2)
    finally:
        os.kill(scheduler.pid, signal.SIGCONT)
    budgets = [float(found) for found in re.findall(r"scheduler tls://\S+ gets ([0-9.]+) s: what is left of the "
                                                    r"operation's timeout of 2s", caplog.text)]
    assert budgets and all(budget <= 2.0 for budget in budgets), caplog.text
    # It says what it left: the size it set, what it found, and what stops it.
    assert "timeout of 2s ran out" in info.value.message and "last state: dask/timeouts" in info.value.message
    assert "left running: dask/timeouts with desired_workers=2" in info.value.message, info.value.message
    assert info.value.remedy_command == "ddlscale local down --name timeouts"
    assert info.value.left_in_place == "desired_workers=2"
    backend.down(REF)


def _cut_steps(messages: list) -> list:
    """(what, seconds, the operation's timeout) of each step :func:`probe_timeout` cut, from its debug lines."""
    import re

    found = (re.match(r"(.+?) gets ([0-9.]+) s: what is left of the operation's timeout of (\S+?)(?: \(|$)", m)
             for m in messages)
    return [(match[1], float(match[2]), match[3]) for match in found if match]


@pytest.mark.slow
def test_a_phase_whose_new_scheduler_hangs_gives_the_cluster_back_within_the_cleanup_grace(local_env, caplog):
    """The phase creates the cluster; its scheduler is stopped (SIGSTOP) as soon as it is recorded, so it never
    answers and ignores SIGTERM. The scale-up times out; the restore that takes the cluster down is a clean-up
    under a deadline of CLEANUP_GRACE, each step of it (the SIGTERM's wait for the stopped scheduler included)
    at most PROBE_GRACE, and the error says what it left. It used to get a second full timeout, and the stopped
    scheduler the whole stop grace (5 s) before its SIGKILL."""
    import logging
    import os
    import signal

    from flytekitplugins_ddlscale._core.lifetime import add_pause_hook
    from flytekitplugins_ddlscale._core.waiting import CLEANUP_GRACE, PROBE_GRACE
    from flytekitplugins_ddlscale.backends.local import _procs as procs

    backend = local_backend(local_env)
    stopped = []

    def stop_the_scheduler(point: str) -> None:
        if point == "worker-started" and not stopped:
            scheduler = backend.store.load(REF).scheduler
            os.kill(scheduler.pid, signal.SIGSTOP)
            stopped.append(scheduler)

    remove = add_pause_hook(stop_the_scheduler)
    try:
        with caplog.at_level(logging.DEBUG, logger="flytekitplugins_ddlscale"), pytest.raises(ScalingTimeoutError) as info:
            with cluster_phase(REF, 2, timeout=2, deck=False):
                pytest.fail("the body must not run")
    finally:
        remove()
    assert stopped, "the scheduler was never started"
    text = str(info.value)
    assert "the phase's timeout of 2s ran out" in text, text
    assert "The change (desired_workers=2) was then undone: the cluster was set to 0 workers (as found); " \
           "nothing is left in place" in text, text
    assert backend.list_clusters() == [] and not procs.is_alive(stopped[0])
    messages = [record.getMessage() for record in caplog.records]
    timed_out = next(i for i, m in enumerate(messages) if "timeout ran out while its Dask scheduler was starting" in m)
    restore = messages[timed_out + 1:]
    steps = _cut_steps(restore)
    grace = f"{CLEANUP_GRACE:g}s"
    scheduler_exit = [budget for what, budget, of in steps if what == f"the exit of processes [{stopped[0].pid}]" and of == grace]
    assert scheduler_exit == [PROBE_GRACE], restore
    assert all(budget <= PROBE_GRACE for what, budget, of in steps if of == grace), steps


@pytest.mark.slow
def test_a_restore_that_runs_out_of_its_grace_names_what_is_still_running_and_how_to_stop_it(local_env):
    """A cluster of 1 worker (``up``) whose scheduler hangs: the phase's scale-up to 2 times out, and its restore
    to 1 worker cannot see that worker either, so it runs out of CLEANUP_GRACE (not a second phase timeout)
    and the error names what is left running and the command that stops it."""
    import os
    import signal

    from flytekitplugins_ddlscale._core.waiting import CLEANUP_GRACE

    backend = local_backend(local_env)
    backend.up(REF, 1, timeout=120)
    scheduler = backend.store.load(REF).scheduler
    os.kill(scheduler.pid, signal.SIGSTOP)
    try:
        with pytest.raises(ScalingTimeoutError) as info:
            with cluster_phase(REF, 2, timeout=2, deck=False):
                pytest.fail("the body must not run")
    finally:
        os.kill(scheduler.pid, signal.SIGCONT)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    restore_error = getattr(info.value, "ddlscale_restore_error")
    assert isinstance(restore_error, ScalingTimeoutError)
    assert f"the operation's timeout is {CLEANUP_GRACE:g}s" in restore_error.message or \
        f"timeout of {CLEANUP_GRACE:g}s ran out" in restore_error.message, restore_error.message
    assert f"left running: {REF} Failed: desired=1 existing=1 ready=0; to stop it: " \
           f"`ddlscale local down --name {REF.name}`" in notes, notes
    backend.down(REF)
