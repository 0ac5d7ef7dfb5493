"""Timeouts that hold and texts that are true, on real local Dask clusters.

A timeout bounds creating a cluster too (the scheduler's start is part of
the operation): a scale or a phase on a new cluster whose timeout runs out
while the scheduler starts fails with a timeout error that says what it left;
a phase that then restored the cluster says so instead of "left in place".
Outcomes and texts only: no wall-clock limits.
"""
import pytest

from flytekitplugins_ddlscale.errors import ScalingTimeoutError
from flytekitplugins_ddlscale._services.hold import cluster_phase
from flytekitplugins_ddlscale.models import ReplicaSpec
from flytekitplugins_ddlscale.refs import ClusterRef
from tests.flyte_support import local_backend, local_env  # noqa: F401 - fixture

REF = ClusterRef("dask", "timeouts")


@pytest.mark.slow
def test_a_scale_creating_a_cluster_fails_at_its_timeout_and_says_what_it_left(local_env):
    backend = local_backend(local_env)
    # A scheduler (importing distributed) and 4 workers cannot start within 0.5 s: this used to wait
    # for the scheduler regardless (60 s at most) and then succeed, seconds past the timeout.
    with pytest.raises(ScalingTimeoutError) as info:
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
    with pytest.raises(ScalingTimeoutError) as info:
        with cluster_phase(REF, 4, timeout=0.5, deck=False):
            pytest.fail("the body must not run")
    text = str(info.value)
    assert "nothing was rolled back" not in text and "left in place:" not in text, text
    assert "the cluster was set to 0 workers (as found); nothing is left in place" in text
    assert info.value.left_in_place is None and info.value.remedy_command is None
    assert backend.list_clusters() == []


@pytest.mark.slow
def test_a_phase_timeout_after_the_restore_says_what_the_restore_set(local_env):
    backend = local_backend(local_env)
    backend.up(REF, 1, timeout=120)
    backend.restore_baseline(REF, ReplicaSpec(1), timeout=120)
    # 6 new worker processes cannot register within 1 s; the phase then puts back the 1 it found.
    with pytest.raises(ScalingTimeoutError) as info:
        with cluster_phase(REF, 6, timeout=1, deck=False):
            pytest.fail("the body must not run")
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
    # It says what it left: the size it set, and what it found.
    assert "timeout of 2s ran out" in info.value.message and "last state: dask/timeouts" in info.value.message
    backend.down(REF)
