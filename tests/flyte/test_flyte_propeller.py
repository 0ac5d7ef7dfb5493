"""The quick start's flow run by the real FlytePropeller v1.16.8, configured as docs/sandbox.md says.

FlytePropeller (built from its Go module) runs ``examples/hybrid_flow.py``'s
``hybrid_flow`` on a real kube-apiserver: its python tasks as pods (run by the
process kubelet), its ``ddlscale_*`` nodes through a stock ``pyflyte serve
connector`` when the guide's block is in its configuration, and as pods when
it is not. What FlytePropeller reports for the UI is read from the events it
sent to flyteadmin's event API (:mod:`tests.flyte.admin_events`).
"""
import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.envtest.controlplane import ENV_DIR, missing_requirements
from tests.flyte.peers import MissingPeer, find_peers
from tests.flyte.plane import NAMESPACE, FlytePlane

pytestmark = [pytest.mark.flyte, pytest.mark.slow]

SCALING_NODES = {"n0": "request_workers", "n2": "workers_ready", "n4": "scale_down"}
CLUSTER = "dask/flyte-tier"


def _plane(connector: bool) -> Iterator[FlytePlane]:
    reasons = missing_requirements()
    if reasons:
        pytest.skip(f"flyte tier (real FlytePropeller) not run: {'; '.join(reasons)}")
    try:
        peers = find_peers()
    except MissingPeer as exc:
        pytest.skip(f"flyte tier (real FlytePropeller) not run: {exc}")
    env = {"DDLSCALE_CONNECTOR_BACKENDS": "local"}
    with FlytePlane(peers, Path(os.environ[ENV_DIR]), connector=connector, connector_env=env) as plane:
        yield plane


@pytest.fixture(scope="module")
def with_connector() -> Iterator[FlytePlane]:
    yield from _plane(connector=True)


@pytest.fixture(scope="module")
def without_connector() -> Iterator[FlytePlane]:
    yield from _plane(connector=False)


def _hybrid_flow():
    os.environ.setdefault("DDLSCALE_EXAMPLE_CLUSTER", CLUSTER)
    from examples import hybrid_flow

    return hybrid_flow


def _pods(plane: FlytePlane, execution: str) -> list:
    from kubernetes import client

    pods = client.CoreV1Api(plane.admin).list_namespaced_pod(NAMESPACE).items
    return [p.metadata.name for p in pods if p.metadata.name.startswith(execution)]


def test_connector_mode_runs_scaling_nodes_in_the_connector_and_python_tasks_in_pods(with_connector):
    flow = _hybrid_flow()
    assert flow.CLUSTER == CLUSTER
    execution = with_connector.run(flow.hybrid_flow, {"n": 2000, "workers": 2}, timeout=240)
    assert execution.phase == "Success", (execution.message, with_connector.log("connector"))
    started = with_connector.kubelet.started_pods() if hasattr(with_connector.kubelet, "started_pods") else None
    task_events = with_connector.events.tasks_of(execution.name)
    by_node = {}
    for event in task_events:
        by_node.setdefault(event.parent_node_execution_id.node_id, set()).add(event.task_id.name.rsplit(".", 1)[-1])
    assert by_node, "FlytePropeller sent no task event"
    connector_nodes = {node for node, names in by_node.items() if names & set(SCALING_NODES.values())}
    assert connector_nodes, by_node
    # A connector node has no pod; a python task's pod is named after the execution and node.
    pods = _pods(with_connector, execution.name)
    for node in connector_nodes:
        assert not [p for p in pods if p.startswith(f"{execution.name}-{node}-")], (node, pods)
    assert pods, "no python task ran in a pod"
    if started is not None:
        assert started
