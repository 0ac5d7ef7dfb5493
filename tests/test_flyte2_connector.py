"""The Flyte 2 connector for every scaling node type, in-process against a real local Dask cluster.

Driven two ways: its ``create``/``get``/``delete`` directly, with templates
and input values as Flyte 2's connector service hands them over, and
through that service itself (flyte's ``AsyncConnectorService``, in-process:
input literals in, output literals out). The service below it is the one
flytekit's connector uses (tests/test_connector*.py). Over real gRPC (flyte's
``c0`` server): tests/test_flyte2_connector_grpc.py; the Flyte 2 nodes through
flyte's local connector runner: tests/test_flyte2.py.
"""
import asyncio
import time

import pytest

flyte = pytest.importorskip("flyte", reason="the Flyte 2 connector needs the flyte2 extra (pip install -e '.[flyte2]')")

from flyte.connectors import ConnectorRegistry  # noqa: E402
from flyteidl2.core import interface_pb2, tasks_pb2  # noqa: E402
from flyteidl2.core.execution_pb2 import TaskExecution  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from google.protobuf.struct_pb2 import Struct  # noqa: E402

from flytekitplugins_ddlscale._services.connector_meta import ScalingMetadata  # noqa: E402
from flytekitplugins_ddlscale.flyte2.connector import ScalingConnector, register_connectors  # noqa: E402
from flytekitplugins_ddlscale._services.nodes.restart import RESTART_TASK_TYPE  # noqa: E402
from flytekitplugins_ddlscale._services.nodes.restore import RESTORE_TASK_TYPE, RestoreConfig, RestoreOutcome  # noqa: E402
from flytekitplugins_ddlscale._services.nodes.scale import SCALE_TASK_TYPE, ScaleConfig, ScaleOutcome  # noqa: E402
from flytekitplugins_ddlscale._services.nodes.wait import WAIT_TASK_TYPE, ClusterReady, WaitConfig  # noqa: E402
from flytekitplugins_ddlscale.refs import ClusterRef  # noqa: E402
from flytekitplugins_ddlscale._services.connector_policy import NotServedError  # noqa: E402
from flytekitplugins_ddlscale.errors import InvalidInputError  # noqa: E402
from tests.flyte_support import local_backend, local_env  # noqa: E402,F401 - fixture

CLUSTER = "dask/flyte2-conn"


@pytest.fixture
def local_served(local_env, monkeypatch):
    """``local_env`` with the connectors rebuilt to serve the local backend (they do only when listed),
    and rebuilt with the defaults after the test."""
    monkeypatch.setenv("DDLSCALE_CONNECTOR_BACKENDS", "local")
    register_connectors()
    yield local_env
    monkeypatch.delenv("DDLSCALE_CONNECTOR_BACKENDS")
    register_connectors()


def template(task_type, config):
    """A Flyte 2 task template of ``task_type`` whose ``custom`` is ``config`` (as a Struct, numbers as doubles)."""
    return tasks_pb2.TaskTemplate(type=task_type, custom=json_format.ParseDict(config.to_custom(), Struct()))


def poll(connector, meta, limit=90.0):
    """``get`` (on the metadata round-tripped through bytes, as the service stores it) until not RUNNING."""
    meta = ScalingMetadata.decode(meta.encode())
    deadline = time.monotonic() + limit
    while True:
        resource = asyncio.run(connector.get(meta))
        if resource.phase != TaskExecution.RUNNING or time.monotonic() > deadline:
            return resource
        time.sleep(0.2)


def test_a_connector_is_registered_for_every_node_type_and_the_entry_point_loads_them():
    from importlib.metadata import entry_points

    for task_type in (SCALE_TASK_TYPE, WAIT_TASK_TYPE, RESTORE_TASK_TYPE, RESTART_TASK_TYPE):
        connector = ConnectorRegistry.get_connector(task_type)
        assert isinstance(connector, ScalingConnector) and connector.task_type_name == task_type
    (entry,) = [e for e in entry_points(group="flyte.connectors") if e.value.startswith("flytekitplugins_ddlscale")]
    assert entry.value == "flytekitplugins_ddlscale.flyte2.connector"
    with pytest.raises(ValueError, match="task_type must be one of"):
        ScalingConnector("python")


def refused(connector, task_template, inputs=None):
    """The one line a refused node fails with: ``create`` answers a refused metadata naming no cluster (a raised
    create is one a retry may get past), whose first ``get`` is FAILED with that line."""
    meta = asyncio.run(connector.create(task_template, "", inputs=inputs))
    assert meta.error and (meta.cluster, meta.pending, meta.task_type) == ("", "", connector.task_type_name), meta
    resource = asyncio.run(connector.get(ScalingMetadata.decode(meta.encode())))
    assert resource.phase == TaskExecution.FAILED and resource.message == meta.error and "\n" not in meta.error
    return resource.message


def test_the_local_backend_is_refused_unless_the_deployment_lists_it(local_env):
    connector = ScalingConnector(SCALE_TASK_TYPE)
    message = refused(connector, template(SCALE_TASK_TYPE, ScaleConfig(cluster=CLUSTER, replicas=1)))
    assert message.startswith(f"[{NotServedError.code}]") and "local" in message, message
    assert local_backend(local_env).list_clusters() == []


def test_bad_inputs_and_templates_are_refused_naming_the_field_before_anything_starts(local_served):
    connector = ScalingConnector(SCALE_TASK_TYPE)
    config = template(SCALE_TASK_TYPE, ScaleConfig(cluster=CLUSTER, replicas=1))
    message = refused(connector, config, inputs={"replicas": -1})
    assert message.startswith("[invalid_input] invalid replicas=-1; allowed: an integer from 0 to")
    no_custom = tasks_pb2.TaskTemplate(type=SCALE_TASK_TYPE)
    assert refused(connector, no_custom).startswith(f"[{InvalidInputError.code}] invalid custom")
    assert local_backend(local_served).list_clusters() == []


@pytest.mark.slow
def test_scale_wait_and_restore_through_the_connector_on_real_dask(local_served):
    scale = ScalingConnector(SCALE_TASK_TYPE)
    requested = asyncio.run(scale.create(template(SCALE_TASK_TYPE, ScaleConfig(cluster=CLUSTER, replicas=1, wait=False)),
                                         "", inputs={"replicas": 2}))
    assert requested.target == -1  # wait=False: the first get is the outcome
    done = asyncio.run(scale.get(requested))
    assert done.phase == TaskExecution.SUCCEEDED and done.outputs["o0"].effective == 2
    assert isinstance(done.outputs["o0"], ScaleOutcome) and done.outputs["o0"].waited is False

    wait = ScalingConnector(WAIT_TASK_TYPE)
    resource = poll(wait, asyncio.run(wait.create(template(WAIT_TASK_TYPE, WaitConfig(cluster=CLUSTER, timeout=60)), "")))
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    ready = resource.outputs["o0"]
    assert isinstance(ready, ClusterReady) and ready.ready_workers == 2 and ready.backend == "local"
    assert "registered with the Dask scheduler" in ready.readiness

    restore = ScalingConnector(RESTORE_TASK_TYPE)
    meta = asyncio.run(restore.create(template(RESTORE_TASK_TYPE, RestoreConfig(cluster=CLUSTER, replicas=0, timeout=60)), ""))
    asyncio.run(restore.delete(meta))  # an abort stops the wait only: the change was sent and goes on
    resource = poll(restore, meta)
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    back = resource.outputs["o0"]
    assert isinstance(back, RestoreOutcome) and back.previous_workers == 2 and back.workers == 0
    state = local_backend(local_served).get_state(ClusterRef.parse(CLUSTER))
    assert state.desired_workers == 0


class GrpcContext:
    """What flyte's service writes to a gRPC context when a call fails (a call that succeeds writes nothing)."""

    def __init__(self):
        self.code = self.details = None

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details


@pytest.mark.slow
def test_flytes_connector_service_takes_input_literals_and_gives_back_the_typed_outcome(local_served):
    """The deployment path, in-process: CreateTask with the template and input literals, GetTask with the
    stored bytes (flyte's own AsyncConnectorService, which flyte's connector server ``c0`` serves over gRPC)."""
    from flyte._internal.runtime.convert import convert_from_native_to_inputs
    from flyte.connectors._server import AsyncConnectorService
    from flyte.models import NativeInterface
    from flyte.types import TypeEngine
    from flyteidl2.connector.connector_pb2 import CreateTaskRequest, GetTaskRequest, TaskCategory

    async def run():
        replicas = interface_pb2.Variable(type=TypeEngine.to_literal_type(int))
        task = template(SCALE_TASK_TYPE, ScaleConfig(cluster=CLUSTER, replicas=2, wait=True, timeout=60))
        task.interface.CopyFrom(interface_pb2.TypedInterface(
            inputs=interface_pb2.VariableMap(variables=[interface_pb2.VariableEntry(key="replicas", value=replicas)])
        ))
        inputs = await convert_from_native_to_inputs(NativeInterface.from_types({"replicas": (int, None)}, {}), replicas=1)
        service, context = AsyncConnectorService(), GrpcContext()
        created = await service.CreateTask(CreateTaskRequest(template=task, inputs=inputs.proto_inputs), context)
        assert context.code is None, context.details
        deadline = time.monotonic() + 90
        while True:
            got = await service.GetTask(
                GetTaskRequest(task_category=TaskCategory(name=SCALE_TASK_TYPE), resource_meta=created.resource_meta),
                context,
            )
            assert context.code is None, context.details
            if got.resource.phase != TaskExecution.RUNNING or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert got.resource.phase == TaskExecution.SUCCEEDED, got.resource.message
        (literal,) = [entry.value for entry in got.resource.outputs.literals if entry.name == "o0"]
        return await TypeEngine.to_python_value(literal, ScaleOutcome)

    outcome = asyncio.run(run())
    # The input literal (1), not the definition's 2, and the wait the definition asked for.
    assert isinstance(outcome, ScaleOutcome) and outcome.effective == 1 and outcome.waited and outcome.ready_workers == 1
