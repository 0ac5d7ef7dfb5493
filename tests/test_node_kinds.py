"""A node type is its one declaration: a ``NodeKind`` written outside the package runs on every surface.

``CountWorkers`` below is a node type the package does not have (it reports
a cluster's worker count). Declared as a node type module would declare it
(configuration, outcome, run, summary line, connector create and finish in
one ``NodeKind``), it becomes a flytekit task with one class line, a Flyte 2
constructor with one call, and a type the connector serves once it is in
the registry, with nothing else written for it.
"""
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import pytest

from flytekitplugins_ddlscale._core.timeline import WorkerTimeline, observed_workers
from flytekitplugins_ddlscale._services.connector_core import SUCCEEDED, ScalingService
from flytekitplugins_ddlscale._services.connector_policy import ConnectorPolicy
from flytekitplugins_ddlscale._services.nodes.kinds import Creation, NodeConfig, NodeKind, NodeOutcome, Sent
from flytekitplugins_ddlscale._services.nodes import NODE_KINDS
from flytekitplugins_ddlscale._services.opening import open_backend
from flytekitplugins_ddlscale.errors import InvalidInputError
from flytekitplugins_ddlscale.refs import parse_cluster
from flytekitplugins_ddlscale.tasks.base import ScalingTaskBase
from tests.framework_support import use_scaler

CLUSTER = "dask/kinds-test"


@dataclass(frozen=True)
class CountConfig(NodeConfig):
    """Defaults of a ``CountWorkers`` node."""

    timeout: float = 30.0
    backend: Optional[str] = None


@dataclass
class CountOutcome(NodeOutcome):
    """What a ``CountWorkers`` node saw."""

    workers: int


def run_count(config: CountConfig, cluster: str, progress: Any = None) -> Tuple[CountOutcome, WorkerTimeline]:
    ref = parse_cluster(cluster)
    timeline = WorkerTimeline()
    with open_backend(config.backend) as backend:
        state = backend.get_state(ref)
        timeline.add(observed_workers(state), state.worker_hw_tier, seconds=0.0)
        timeline.finish()
        return CountOutcome(str(ref), backend.name, state.desired_workers), timeline


def count_line(step: str, outcome: CountOutcome, seconds: Optional[float] = None) -> str:
    return f"{step}: {outcome.cluster} wants {outcome.workers} workers"


def create_count(creation: Creation, config: CountConfig, inputs: Dict[str, Any]) -> Sent:
    backend_name, ref = creation.served(config.backend, inputs["cluster"])
    with creation.opened(backend_name, ref) as backend:
        state = backend.get_state(ref)
        return Sent(ref, state.desired_workers, CountOutcome(str(ref), backend.name, state.desired_workers))


def finish_count(meta: Any, state: Any, elapsed: float, readiness: Any) -> CountOutcome:
    return meta.outcome_of(workers=state.desired_workers)


COUNT = NodeKind(
    "CountWorkers", "ddlscale_test_count", CountConfig, ("cluster",), CountOutcome, "Worker count", count_line,
    run_count, create_count, finish_count, changes_cluster=False,
)


class CountWorkers(ScalingTaskBase[CountConfig]):
    """Report how many workers a cluster wants."""

    kind = COUNT


@pytest.fixture
def scaler(scaler_server, tmp_path, monkeypatch):
    """The scaler test server with dask/kinds-test at 3 workers, chosen through the environment."""
    use_scaler(monkeypatch, scaler_server, tmp_path / "state")
    scaler_server.add_cluster("dask", "kinds-test", replicas=3, max_replicas=6)
    return scaler_server


def test_the_flytekit_node_is_built_from_the_kind_alone(scaler, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    count = CountWorkers("count", cluster=CLUSTER)
    assert list(inspect.signature(CountWorkers).parameters) == ["name", "cluster", "timeout", "backend", "task_options"]
    assert list(count.python_interface.inputs) == ["cluster"]
    outcome = count()
    assert outcome == CountOutcome(CLUSTER, "scaler", 3)
    assert "count: dask/kinds-test wants 3 workers" in caplog.text
    with pytest.raises(TypeError, match="unexpected keyword argument 'replicas'"):
        CountWorkers("count", cluster=CLUSTER, replicas=2)
    with pytest.raises(InvalidInputError, match="timeout"):
        CountWorkers("count", cluster=CLUSTER, timeout=-1)


def test_the_connector_serves_the_kind_once_it_is_registered(scaler, monkeypatch):
    service = ScalingService(ConnectorPolicy.from_env())
    custom = CountConfig(CLUSTER, backend="scaler").to_custom()
    with pytest.raises(InvalidInputError, match="ddlscale_test_count"):
        service.create(COUNT.task_type, custom, {})

    monkeypatch.setitem(NODE_KINDS, COUNT.task_type, COUNT)
    meta = service.create(COUNT.task_type, custom, {})
    assert meta.error == "" and meta.target == 3
    scaler.set_pod_ready_delay(0.0)
    poll = service.poll(meta)
    assert poll.state == SUCCEEDED, poll.message
    assert poll.outcome == CountOutcome(CLUSTER, "scaler", 3)


def test_the_flyte2_constructor_is_built_from_the_kind_alone():
    pytest.importorskip("flyte")
    import flyte

    from flytekitplugins_ddlscale.flyte2.nodes import _constructor

    define = _constructor(COUNT, "Report how many workers a cluster wants.")
    assert list(inspect.signature(define).parameters) == ["name", "cluster", "timeout", "backend", "env"]
    node = define("count", cluster=CLUSTER, env=flyte.TaskEnvironment("kinds"))
    assert node.task_type == COUNT.task_type
    assert list(node.interface.inputs) == ["cluster"]
