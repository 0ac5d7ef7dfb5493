"""Faults during a phase's body on real local Dask: a killed scheduler, a killed worker.

The phase's monitor sees them at its next sample, logs them, repairs them
(the local backend restarts the scheduler on its port and replaces lost
workers), and the summary line and the Deck say what happened; with
``fail_on_fault`` the body is stopped and the phase raises
``ClusterFaultError`` after restoring the cluster.
"""
import logging
import os
import signal
import time

import pytest
from flytekit.core.context_manager import FlyteContextManager

from flytekitplugins_ddlscale.backends.local import _procs as procs
from flytekitplugins_ddlscale.errors import ClusterFaultError, InvalidInputError
from flytekitplugins_ddlscale._services.hold import cluster_phase
from flytekitplugins_ddlscale._services.hold.monitor import REPAIRED, REPORTED, Fault, find_fault
from flytekitplugins_ddlscale.models import ClusterState
from flytekitplugins_ddlscale.phase import distributed_phase
from flytekitplugins_ddlscale.refs import ClusterRef
from tests.flyte_support import local_backend, local_env  # noqa: F401 - fixture

CLUSTER = "dask/faults"
REF = ClusterRef.parse(CLUSTER)
WHOLE_AGAIN = 120.0
"""Seconds a repair may take on this shared machine (a scheduler and three workers start)."""


def _wait(condition, what: str, timeout: float = WHOLE_AGAIN) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def _summary(caplog) -> str:
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"phase: {CLUSTER} ")]
    return line


def _state(up: int, desired: int, head_ready=True) -> ClusterState:
    return ClusterState(
        cluster=CLUSTER, status="Running", desired_workers=desired, existing_workers=up,
        ready_workers=up, head_ready=head_ready,
    )


def test_find_fault_names_a_lost_head_lost_workers_or_a_size_scaled_below_the_need():
    assert find_fault(_state(3, 3), 3) is None
    assert find_fault(_state(4, 4), 3) is None
    assert find_fault(_state(0, 3, head_ready=False), 3, "scheduler") == (
        "the scheduler of dask/faults stopped answering (0 of 3 workers up)"
    )
    assert find_fault(_state(2, 3), 3) == "dask/faults has 2 of its 3 workers up (1 lost)"
    # Fewer up for any reason is a fault; a pull-back whose workers are still up is not yet one.
    assert find_fault(_state(1, 1), 3) == "dask/faults was scaled down to 1 worker (1 up), below the 3 this phase needs"
    assert find_fault(_state(3, 1), 3) is None
    assert find_fault(_state(3, 3, head_ready=None), 3) is None
    assert Fault("x lost", 2.0, REPORTED, ended=5.5).text() == (
        f"x lost at 2.0 s; {REPORTED}; whole again after 3.5 s"
    )
    assert Fault("x lost", 2.0, REPAIRED).text().endswith("not whole again by the end")


def test_fail_on_fault_is_checked_with_the_other_options():
    with pytest.raises(InvalidInputError) as info:
        distributed_phase(cluster=CLUSTER, replicas=1, fail_on_fault="yes")
    assert info.value.field == "fail_on_fault"


@pytest.mark.slow
def test_a_scheduler_killed_mid_body_is_restarted_on_its_port_and_the_summary_says_so(local_env, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    backend = local_backend(local_env)
    decks = FlyteContextManager.current_context().user_space_params.decks
    before = len(decks)
    with cluster_phase(CLUSTER, 3, timeout=120, sample_interval=0.2) as phase:
        record = backend.store.load(REF)
        port, old = record.port, record.scheduler
        os.kill(old.pid, signal.SIGKILL)
        _wait(lambda: phase.faults and phase.faults[-1].ended is not None, "the cluster whole again")
        record = backend.store.load(REF)
        assert record.port == port and record.scheduler != old and procs.is_alive(record.scheduler)
        assert backend.get_state(REF).ready_workers == 3
    [fault] = phase.faults
    assert fault.what == "the scheduler of dask/faults stopped answering (0 of 3 workers up)"
    assert fault.action == REPAIRED
    line = _summary(caplog)
    assert "; done after" in line
    assert line.endswith(f"; 1 fault during the body: {fault.text()}"), line
    assert "whole again after" in line
    assert len(decks) == before + 1 and "the scheduler of dask/faults stopped answering" in decks[0].html
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("stopped answering" in r.getMessage() for r in logged)
    assert backend.list_clusters() == []


@pytest.mark.slow
def test_a_worker_killed_mid_body_is_replaced_and_the_summary_says_so(local_env, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    backend = local_backend(local_env)
    with cluster_phase(CLUSTER, 3, timeout=120, sample_interval=0.2, deck=False) as phase:
        victim = backend.store.load(REF).workers[1]
        os.kill(victim.proc.pid, signal.SIGKILL)
        _wait(lambda: phase.faults and phase.faults[-1].ended is not None, "the cluster whole again")
        workers = backend.store.load(REF).workers
        assert victim.name not in [w.name for w in workers] and len(workers) == 3
    [fault] = phase.faults
    assert fault.what == "dask/faults has 2 of its 3 workers up (1 lost)"
    line = _summary(caplog)
    assert line.endswith(f"; 1 fault during the body: {fault.text()}") and "; done after" in line, line


@pytest.mark.slow
def test_with_fail_on_fault_a_lost_worker_stops_the_body_and_fails_the_phase(local_env, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    backend = local_backend(local_env)
    reached_the_end = False
    with pytest.raises(ClusterFaultError) as info:
        with cluster_phase(CLUSTER, 3, timeout=120, sample_interval=0.2, deck=False, fail_on_fault=True):
            os.kill(backend.store.load(REF).workers[0].proc.pid, signal.SIGKILL)
            time.sleep(WHOLE_AGAIN)
            reached_the_end = True
    assert not reached_the_end
    assert "has 2 of its 3 workers up (1 lost)" in str(info.value)
    assert "fail_on_fault" in str(info.value)
    line = _summary(caplog)
    assert "failed after" in line and "(ClusterFaultError)" in line, line
    assert "the phase was failed (fail_on_fault)" in line
    # No repair was sent, and the cluster the phase created is gone.
    assert not any("repairing" in r.getMessage() for r in caplog.records)
    assert backend.list_clusters() == []
