"""@distributed_phase / cluster_phase against real local Dask clusters."""
import logging
import os
import re
import signal
import time

import pytest
from flytekit.core.context_manager import FlyteContextManager

from flytekitplugins_ddlscale.errors import InvalidInputError, UnsupportedOperationError
from flytekitplugins_ddlscale.models import ReplicaSpec
from flytekitplugins_ddlscale.phase import PhaseInterrupted, cluster_phase, distributed_phase
from flytekitplugins_ddlscale.refs import ClusterRef
from tests.flyte_apps import phased
from tests.flyte_support import local_backend, local_env  # noqa: F401 - fixture

CLUSTER = "dask/phase-test"
REF = ClusterRef.parse(CLUSTER)


def existing_cluster(backend, replicas):
    """A cluster that was there before any phase: running, with no baseline recorded yet."""
    backend.up(REF, replicas, timeout=60)
    # `up` records a baseline at creation; restoring to an explicit spec forgets it.
    backend.restore_baseline(REF, ReplicaSpec(replicas), timeout=60)
    assert backend.get_baseline(REF) is None


def test_the_phase_goes_below_task():
    from flytekit import task

    @task
    def body() -> int:
        return 1

    with pytest.raises(TypeError) as info:
        distributed_phase(cluster=CLUSTER, replicas=1)(body)
    assert "applied to the Flyte task" in str(info.value) and "so put it below @task:" in str(info.value)
    assert "    @task\n    @distributed_phase(cluster=..., replicas=...)\n    def body(...): ..." in str(info.value)


def test_decorator_arguments_are_checked_when_applied():
    for kwargs, field in [
        (dict(replicas=-1), "replicas"),
        (dict(replicas=1, restore="previous"), "restore"),
        (dict(replicas=1, restore=ReplicaSpec(replicas=-2)), "restore.replicas"),
        (dict(replicas=1, timeout=-5), "timeout"),
        (dict(replicas=1, reassert_interval=0), "reassert_interval"),
        (dict(replicas=1, lease_seconds=0), "lease_seconds"),
        (dict(replicas=1, lease_seconds=10**6), "lease_seconds"),
        (dict(replicas=1, cluster="dask/UPPER"), "name"),
    ]:
        kwargs.setdefault("cluster", CLUSTER)
        with pytest.raises(InvalidInputError) as info:
            distributed_phase(**kwargs)
        assert info.value.field == field


def test_wrapped_function_keeps_its_typed_interface():
    assert list(phased.total_on_cluster.python_interface.inputs) == ["values", "scale"]
    assert phased.total_on_cluster.python_interface.outputs == {"o0": int}


@pytest.mark.slow
def test_phase_under_task_scales_for_the_body_and_restores_after(local_env):
    assert phased.phase_flow(scale=3) == 18
    # The local cluster was created by the phase (baseline: none), so restoring takes it down.
    assert local_backend(local_env).list_clusters() == []
    assert "DASK_SCHEDULER_SERVICE_HOST" not in os.environ


@pytest.mark.slow
def test_restore_on_exception_keeps_the_body_error_and_reports_a_deck(local_env, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    backend = local_backend(local_env)
    existing_cluster(backend, 1)
    decks = FlyteContextManager.current_context().user_space_params.decks
    before = len(decks)
    with pytest.raises(ZeroDivisionError):
        with cluster_phase(CLUSTER, 2, worker_hw_tier="Medium", timeout=60, sample_interval=0.1) as phase:
            assert backend.get_state(REF).ready_workers == 2
            assert phase.framework_check and "Dask scheduler" in phase.framework_check
            time.sleep(0.5)
            1 / 0
    state = backend.get_state(REF)
    assert state.desired_workers == 1 and state.ready_workers == 1
    assert backend.get_baseline(REF) is None
    deck = decks[0]  # first, so the task's Deck file opens on it
    assert len(decks) == before + 1 and deck.name == "Distributed phase"
    assert "<polyline" in deck.html and "Medium" in deck.html
    assert phase.timeline.worker_seconds_by_tier().get("Medium", 0) > 0.5
    # The restore is marked and its result is the last sample of the plot.
    [(restore_at, label)] = phase.timeline.marks
    assert label == "restore" and ">restore<" in deck.html
    assert phase.timeline.samples[-1].seconds >= restore_at and phase.timeline.samples[-1].workers == 1
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phase: dask/phase-test")]
    assert len(summary) == 1 and "0 -> 2 workers ready" not in summary[0]
    assert re.fullmatch(
        r"phase: dask/phase-test 1 -> 2 workers ready in \d+\.\d s \(framework: .+\); "
        r"failed after \d+\.\d s \(ZeroDivisionError\), restored to 1 worker \(as found\)",
        summary[0],
    ), summary


@pytest.mark.slow
def test_sigterm_in_the_body_restores_and_puts_handlers_back(local_env):
    backend = local_backend(local_env)
    existing_cluster(backend, 1)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(PhaseInterrupted) as info:
        with cluster_phase(CLUSTER, 2, timeout=60):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
    assert info.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous
    assert backend.get_state(REF).desired_workers == 1


def test_unsupported_kind_is_refused_before_anything_changes(local_env):
    with pytest.raises(UnsupportedOperationError):
        with cluster_phase("mpi/phase-test", 2, timeout=30):
            pytest.fail("body must not run")
    assert local_backend(local_env).list_clusters() == []
