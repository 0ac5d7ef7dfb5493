"""The task types running for real: flytekit local execution against the local backend's Dask processes."""
import logging
import re
import time

import pytest
from flytekit.core.context_manager import FlyteContextManager

from flytekitplugins_ddlscale.errors import InvalidInputError, UnreachableWaitError, UnsupportedOperationError
from flytekitplugins_ddlscale.refs import ClusterRef
from flytekitplugins_ddlscale.tasks import ScaleCluster, ScaleOutcome
from tests.flyte_apps import nodes
from tests.flyte_support import local_backend, local_env, processes_mentioning  # noqa: F401 - fixture

REF = ClusterRef.parse(nodes.CLUSTER)

pytestmark = pytest.mark.slow


def test_up_work_down_runs_real_workers(local_env):
    assert nodes.up_work_down() == 2
    state = local_backend(local_env).get_state(REF)
    assert state.desired_workers == 0 and state.ready_workers == 0


def test_scale_outcome_is_typed_reports_readiness_and_attaches_a_deck(local_env):
    params = FlyteContextManager.current_context().user_space_params
    before = len(params.decks)
    outcome = nodes.scale_up.execute(cluster=nodes.CLUSTER, replicas=1)
    assert isinstance(outcome, ScaleOutcome)
    assert (outcome.cluster, outcome.backend, outcome.requested, outcome.effective) == (nodes.CLUSTER, "local", 1, 1)
    assert outcome.previous_workers == 0 and outcome.ready_workers == 1 and outcome.waited and not outcome.capped
    deck = params.decks[0]  # first, so the task's Deck file opens on it
    assert len(params.decks) == before + 1 and deck.name == "Cluster scaling"
    assert "<svg" in deck.html and "<polyline" in deck.html and "worker-seconds" in deck.html


def test_the_summary_time_is_the_nodes_own_with_the_cluster_start_up(local_env, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    started = time.monotonic()
    outcome = nodes.scale_up.execute(cluster=nodes.CLUSTER, replicas=1)
    took = time.monotonic() - started
    line = next(m for m in (r.getMessage() for r in caplog.records) if m.startswith("scale_up: dask/"))
    total, waiting = map(float, re.search(r" in (\d+\.\d) s \((\d+\.\d) s waiting\)", line).groups())
    assert waiting == pytest.approx(outcome.seconds_waited, abs=0.05)
    # Creating the cluster is the node's time too, not only the wait that followed.
    assert waiting < total <= took + 0.05 and total >= took - 0.2, (line, took)


def test_prewarm_request_then_wait_then_compute(local_env):
    assert nodes.prewarmed(x=21) == 42
    state = local_backend(local_env).get_state(REF)
    assert state.ready_workers == 2
    again = nodes.request()
    assert not again.waited and again.effective == 2 and again.previous_workers == 2


def test_bad_runtime_input_changes_nothing(local_env):
    with pytest.raises(InvalidInputError, match="replicas=-3"):
        nodes.scale_up(replicas=-3)
    assert local_backend(local_env).list_clusters() == []


def test_head_tier_on_a_backend_that_cannot_is_refused_before_any_change(local_env):
    task = ScaleCluster("head_tier", cluster="dask/nodes-test", replicas=1, head_hw_tier="Large")
    with pytest.raises(UnsupportedOperationError):
        task.execute(cluster="dask/nodes-test", replicas=1, worker_hw_tier=None, head_hw_tier="Large")
    assert local_backend(local_env).list_clusters() == []


def test_restart_head_node_waits_for_the_new_head(local_env):
    nodes.scale_up(replicas=1)
    outcome = nodes.restart()
    assert outcome.ready and outcome.backend == "local"
    assert local_backend(local_env).get_state(REF).ready_workers == 1


def test_failure_handler_restores_the_cluster(local_env):
    with pytest.raises(Exception, match="stage failed on purpose"):
        nodes.failing(fail=True)
    assert local_backend(local_env).list_clusters() == []


def test_scale_down_node_on_a_missing_cluster_changes_nothing_and_says_so(local_env, caplog):
    with caplog.at_level(logging.INFO, logger="flytekitplugins_ddlscale.local"):
        outcome = nodes.scale_down()
    assert (outcome.requested, outcome.effective, outcome.previous_workers, outcome.workers) == (0, 0, 0, 0)
    assert outcome.ready_workers == 0 and not outcome.waited
    assert f"{REF} does not exist; scaling it to 0 workers changes nothing" in caplog.text
    backend = local_backend(local_env)
    assert backend.list_clusters() == [] and backend.get_baseline(REF) is None
    assert processes_mentioning(str(local_env)) == []


def test_wait_node_for_more_workers_than_desired_fails_at_once(local_env):
    local_backend(local_env).up(REF, 0, timeout=120)
    with pytest.raises(UnreachableWaitError, match=r"replicas=2: .*desired_workers=0 desired, max_workers=16"):
        nodes.ready(replicas=2)
