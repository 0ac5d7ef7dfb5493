"""The quick start's flow run by the real FlytePropeller v1.16.8, configured as docs/sandbox.md says.

FlytePropeller (built from its Go module) runs ``examples/hybrid_flow.py``'s
``hybrid_flow`` on a real kube-apiserver: its python tasks as pods (run by the
process kubelet), its ``ddlscale_*`` nodes through a stock ``pyflyte serve
connector`` when the guide's block is in its configuration, and as pods when
it is not. What FlytePropeller reports for the UI is read from the events it
sent to flyteadmin's event API (:mod:`tests.flyte_tier.admin_events`).
"""
import os
import time
from pathlib import Path
from typing import Dict, Iterator, List, Set

import pytest

from tests.envtest.controlplane import ENV_DIR
from tests.flyte_tier.peers import peers_or_skip
from tests.flyte_tier.plane import NAMESPACE, FlytePlane, quick_start
from tests.flyte_support import processes_mentioning

pytestmark = [pytest.mark.flyte, pytest.mark.slow]

CLUSTER = "dask/flyte-tier"
SCALING = {"request_workers", "workers_ready", "scale_down"}
PYTHON = {"prepare", "sum_of_squares", "check_in_phase"}
TASK_TYPES = {"request_workers": "ddlscale_scale", "scale_down": "ddlscale_scale", "workers_ready": "ddlscale_wait"}
QUEUED, RUNNING, SUCCEEDED = 1, 2, 3
GATED_WORKER = Path(__file__).with_name("gated_worker.py")


def _plane(connector: bool, **env: str) -> Iterator[FlytePlane]:
    peers = peers_or_skip()
    connector_env = {"DDLSCALE_CONNECTOR_BACKENDS": "local", **env}
    pod_env = {"DDLSCALE_EXAMPLE_PREPARE_SECONDS": "0"}
    with FlytePlane(peers, Path(os.environ[ENV_DIR]), connector=connector, connector_env=connector_env,
                    pod_env=pod_env) as plane:
        yield plane


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> Path:
    """Open (the file exists) unless a test closes it: new local Dask workers of the connector wait for it."""
    path = tmp_path_factory.mktemp("gate") / "open"
    path.touch()
    return path


@pytest.fixture(scope="module")
def with_connector(gate) -> Iterator[FlytePlane]:
    yield from _plane(True, DASK_DISTRIBUTED__WORKER__PRELOAD=repr([str(GATED_WORKER)]),
                      DASK_DDLSCALE_TEST_WORKER_GATE=str(gate))


@pytest.fixture(scope="module")
def without_connector() -> Iterator[FlytePlane]:
    yield from _plane(False)


def _hybrid_flow():
    example = quick_start(CLUSTER)
    assert example.CLUSTER == CLUSTER, "examples.hybrid_flow was imported before the tier chose its cluster"
    return example.hybrid_flow


def _nodes_by_task(plane: FlytePlane, execution: str) -> Dict[str, str]:
    """Node id -> the short name of the task FlytePropeller ran there, from its task events."""
    return {e.parent_node_execution_id.node_id: e.task_id.name.rsplit(".", 1)[-1]
            for e in plane.events.tasks_of(execution)}


def _pods_of(plane: FlytePlane, execution: str) -> Set[str]:
    """The node ids whose task ran in a pod (FlytePropeller names a task pod <execution>-<node>-<attempt>)."""
    from kubernetes import client

    pods = client.CoreV1Api(plane.admin).list_namespaced_pod(NAMESPACE).items
    return {p.metadata.name.split("-")[1] for p in pods if p.metadata.name.startswith(f"{execution}-")}


def _assert_at_baseline(plane: FlytePlane) -> None:
    """The flow's cluster holds no workers and no claim: what it found before the flow (no cluster). Its
    scheduler may still run: each node ran in another process (connector, pods), and only a restore of the
    baseline takes down a cluster that a scale made (docs/local.md)."""
    from flytekitplugins_ddlscale.backends.local import LocalBackend
    from flytekitplugins_ddlscale.refs import ClusterRef

    ref = ClusterRef.parse(CLUSTER)
    with LocalBackend(state_dir=plane.state_dir / "local") as backend:
        if backend.store.load(ref) is None:
            assert processes_mentioning(str(plane.state_dir)) == []
            return
        state = backend.get_state(ref)
        assert (state.desired_workers, state.existing_workers) == (0, 0), state
        assert backend.claims(ref) == {}


def test_connector_mode_scaling_nodes_go_to_the_connector_python_tasks_run_in_pods(with_connector):
    execution = with_connector.run(_hybrid_flow(), {"n": 2000, "workers": 2}, timeout=240)
    assert execution.phase == "Success", (execution.message, with_connector.log("connector"))
    tasks = _nodes_by_task(with_connector, execution.name)
    assert set(tasks.values()) == SCALING | PYTHON, tasks
    in_pods = _pods_of(with_connector, execution.name)
    assert {tasks[node] for node in in_pods} == PYTHON, (in_pods, tasks)
    for event in with_connector.events.tasks_of(execution.name):
        kind = tasks[event.parent_node_execution_id.node_id]
        assert event.task_type == TASK_TYPES.get(kind, "python-task"), (kind, event.task_type)
    assert with_connector.connector_calls("create", "ddlscale_scale") >= 2
    assert with_connector.connector_calls("create", "ddlscale_wait") >= 1
    _assert_at_baseline(with_connector)


def test_container_mode_runs_every_node_in_a_pod(without_connector):
    execution = without_connector.run(_hybrid_flow(), {"n": 2000, "workers": 2}, timeout=240)
    assert execution.phase == "Success", execution.message
    tasks = _nodes_by_task(without_connector, execution.name)
    assert set(tasks.values()) == SCALING | PYTHON, tasks
    assert {tasks[node] for node in _pods_of(without_connector, execution.name)} == SCALING | PYTHON
    _assert_at_baseline(without_connector)


def _phases(events: List) -> List[int]:
    return [e.phase for e in events]


def test_a_waiting_connector_node_reaches_the_ui_once_running_and_once_done(with_connector, gate):
    """docs/connector.md ("What FlytePropeller reports"): a RUNNING answer reaches flyteadmin once, without its
    message; later polls that stay RUNNING send nothing; SUCCEEDED carries the outcome (custom_info)."""
    from tests.flyte_apps.gated import gated

    gate.unlink()
    try:
        name = f"gated{int(time.time())}"
        with_connector.submit(gated, {}, name)
        node = with_connector.events.wait_for(
            lambda: next((e.parent_node_execution_id.node_id for e in with_connector.events.tasks_of(name)
                          if e.phase == RUNNING), None), "the scale-up node RUNNING", 120)
        polls = with_connector.connector_calls("get", "ddlscale_scale")
        # Two more polls answered RUNNING while the workers are held back by the gate.
        end = time.monotonic() + 120
        while with_connector.connector_calls("get", "ddlscale_scale") < polls + 2:
            assert time.monotonic() < end, "FlytePropeller did not poll the connector twice more within 120 s"
            time.sleep(0.5)
        # The node ran on while those polls answered RUNNING (the next node starts only after it, so they were its).
        held = _phases(with_connector.events.tasks_of(name))
        running = [e for e in with_connector.events.tasks_of(name, node) if e.phase == RUNNING]
    finally:
        gate.touch()
    execution = with_connector.wait(name, 120)
    assert execution.phase == "Success", execution.message
    events = with_connector.events.tasks_of(name, node)
    assert SUCCEEDED not in held, held
    assert len(running) == 1, _phases(events)
    assert running[0].reason == "", running[0].reason
    first = dict(running[0].custom_info)
    assert first["desired_workers"] == 2 and first["summary"].startswith("waiting for 2 workers"), first
    assert _phases(events) == [QUEUED, QUEUED, RUNNING, SUCCEEDED], _phases(events)
    assert events[1].reason == "launched"
    done = dict(events[-1].custom_info)
    assert done["ready_workers"] >= 2 and "2 workers ready" in done["summary"], done
    assert len(done["timeline"]) >= 1
