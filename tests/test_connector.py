"""The Flyte connector for ddlscale_scale / ddlscale_wait: create once, get until done.

Driven two ways: directly with serialized templates and literal inputs (as
the connector service receives them), and through flytekit's own local
connector runner (AsyncConnectorExecutorMixin).
"""
import time
from collections import OrderedDict

import pytest
from flyteidl.core.execution_pb2 import TaskExecution
from flytekit import FlyteContextManager
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.core.type_engine import TypeEngine
from flytekit.extend.backend.base_connector import AsyncConnectorExecutorMixin, ConnectorRegistry
from flytekit.tools.translator import get_serializable

from flytekitplugins_ddlscale.connector import ScalingConnector, ScalingMetadata, register_connectors
from flytekitplugins_ddlscale.tasks import SCALE_TASK_TYPE, WAIT_TASK_TYPE, ClusterReady, ScaleCluster, ScaleOutcome
from tests.flyte_apps import nodes
from tests.flyte_support import local_backend, local_env  # noqa: F401 - fixture

SETTINGS = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))


@pytest.fixture
def local_served(local_env, monkeypatch):
    """``local_env``, with a connector that serves the local backend (it does only when listed):
    the registered connectors are rebuilt for the test, and rebuilt with the defaults after it."""
    monkeypatch.setenv("DDLSCALE_CONNECTOR_BACKENDS", "local")
    register_connectors()
    yield local_env
    monkeypatch.delenv("DDLSCALE_CONNECTOR_BACKENDS")
    register_connectors()


def template_and_inputs(task, **values):
    template = get_serializable(OrderedDict(), SETTINGS, task).template
    ctx = FlyteContextManager.current_context()
    literals = TypeEngine.dict_to_literal_map(ctx, values, {k: task.python_interface.inputs[k] for k in values})
    return template, literals


def poll(connector, meta, limit=60.0):
    deadline = time.monotonic() + limit
    while True:
        resource = connector.get(meta)
        if resource.phase != TaskExecution.RUNNING or time.monotonic() > deadline:
            return resource
        time.sleep(0.2)


class ConnectorScaleCluster(AsyncConnectorExecutorMixin, ScaleCluster):
    """ScaleCluster run locally through flytekit's connector runner instead of in-process."""


connector_scale = ConnectorScaleCluster(
    "connector_scale", cluster="dask/conn-test", replicas=1, timeout=60, container_image="registry/flows:v1"
)


def test_connectors_are_registered_for_the_served_types():
    import flytekitplugins_ddlscale.connector  # noqa: F401 - registers

    for task_type in (SCALE_TASK_TYPE, WAIT_TASK_TYPE):
        assert isinstance(ConnectorRegistry.get_connector(task_type), ScalingConnector)


def test_metadata_round_trips_through_bytes():
    meta = ScalingMetadata("ddlscale_scale", "dask/x", "", 2, 1.0, 2.0, "{}")
    assert ScalingMetadata.decode(meta.encode()) == meta


@pytest.mark.slow
def test_scale_then_wait_through_the_connector(local_served):
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.request, replicas=2)
    meta = scale.create(template, "", inputs)
    assert meta.target == -1  # the node was defined with wait=False
    done = scale.get(meta)
    assert done.phase == TaskExecution.SUCCEEDED and done.outputs["o0"].effective == 2

    wait = ScalingConnector(WAIT_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.ready, replicas=2)
    meta = wait.create(template, "", inputs)
    resource = poll(wait, ScalingMetadata.decode(meta.encode()))
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    ready = resource.outputs["o0"]
    assert isinstance(ready, ClusterReady) and ready.ready_workers == 2 and ready.backend == "local"


@pytest.mark.slow
def test_get_fails_at_the_deadline_with_the_last_state(scaler_server, tmp_path, monkeypatch):
    from tests.framework_support import use_scaler

    use_scaler(monkeypatch, scaler_server, tmp_path / "state")
    scaler_server.add_cluster("dask", "nodes-test", replicas=1, max_replicas=4)
    scaler_server.set_pod_ready_delay(3600.0)  # the requested pods never appear
    nodes.request()  # asks for 2 without waiting
    wait = ScalingConnector(WAIT_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.ready, replicas=2)
    meta = wait.create(template, "", inputs)
    assert wait.get(meta).phase == TaskExecution.RUNNING
    meta.deadline = meta.started  # as if the node's timeout had passed
    resource = wait.get(meta)
    assert resource.phase == TaskExecution.FAILED
    assert "timed out" in resource.message and "desired=2" in resource.message


def test_a_wait_that_can_never_finish_is_refused_at_create(scaler_server, tmp_path, monkeypatch):
    from tests.framework_support import use_scaler

    use_scaler(monkeypatch, scaler_server, tmp_path / "state")
    scaler_server.add_cluster("dask", "nodes-test", replicas=1, max_replicas=4)
    wait = ScalingConnector(WAIT_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.ready, replicas=3)  # nothing will scale it to 3
    meta = wait.create(template, "", inputs)
    resource = wait.get(ScalingMetadata.decode(meta.encode()))
    assert resource.phase == TaskExecution.FAILED and "[unreachable_wait]" in resource.message
    assert "replicas=3" in resource.message


def test_bad_inputs_are_refused_before_anything_starts(local_served):
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.scale_up, replicas=-1)
    resource = scale.get(scale.create(template, "", inputs))
    assert resource.phase == TaskExecution.FAILED
    assert resource.message.startswith("[invalid_input] invalid replicas=-1; allowed: an integer from 0 to")
    assert local_backend(local_served).list_clusters() == []


@pytest.mark.slow
def test_flytekits_connector_runner_executes_the_node(local_served):
    outcome = connector_scale()
    assert isinstance(outcome, ScaleOutcome) and outcome.effective == 1 and outcome.ready_workers == 1
