"""The deployment mode: `pyflyte serve connector --modules flytekitplugins_ddlscale.connector`, called over gRPC.

FlytePropeller speaks this protocol to the connector service: CreateTask
with the serialized template and input literals, then GetTask with the
returned resource meta until a terminal phase.
"""
import os
import socket
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import grpc
import pytest
from flyteidl.admin import agent_pb2
from flyteidl.core.execution_pb2 import TaskExecution
from flyteidl.service.agent_pb2_grpc import AgentMetadataServiceStub, AsyncAgentServiceStub
from flytekit import FlyteContextManager
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.core.type_engine import TypeEngine
from flytekit.models.literals import LiteralMap
from flytekit.tools.translator import get_serializable

from flytekitplugins_ddlscale.refs import ClusterRef
from flytekitplugins_ddlscale.tasks import ScaleOutcome
from tests.flyte_apps import nodes
from tests.flyte_support import SCALER_ENV, local_backend, local_env  # noqa: F401 - fixture


ROOT = Path(__file__).resolve().parent.parent
SETTINGS = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def connector_service(local_env):
    """The connector service in its own process, with the plugin's connector module loaded."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV}
    env["PYTHONPATH"] = str(ROOT)
    env["DDLSCALE_CONNECTOR_BACKENDS"] = "local"  # served only when listed
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("pyflyte")), "serve", "connector", "--port", str(port),
         "--prometheus_port", str(free_port()), "--modules", "flytekitplugins_ddlscale.connector"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=60)
        yield channel
    finally:
        channel.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()


@pytest.mark.slow
def test_service_lists_the_connector_and_scales_over_grpc(connector_service, local_env):
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # the connector extra: the health checks deployments probe

    health = health_pb2_grpc.HealthStub(connector_service).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    agents = AgentMetadataServiceStub(connector_service).ListAgents(agent_pb2.ListAgentsRequest(), timeout=30)
    served = {c.name for a in agents.agents for c in a.supported_task_categories}
    assert {"ddlscale_scale", "ddlscale_wait"} <= served

    template = get_serializable(OrderedDict(), SETTINGS, nodes.scale_up).template
    ctx = FlyteContextManager.current_context()
    inputs = TypeEngine.dict_to_literal_map(ctx, {"replicas": 1}, {"replicas": int})
    stub = AsyncAgentServiceStub(connector_service)
    created = stub.CreateTask(
        agent_pb2.CreateTaskRequest(template=template.to_flyte_idl(), inputs=inputs.to_flyte_idl(), output_prefix="/tmp/out"),
        timeout=120,
    )
    category = agent_pb2.TaskCategory(name="ddlscale_scale", version=0)
    deadline = time.monotonic() + 120
    while True:
        reply = stub.GetTask(agent_pb2.GetTaskRequest(task_category=category, resource_meta=created.resource_meta), timeout=30)
        if reply.resource.phase != TaskExecution.RUNNING or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert reply.resource.phase == TaskExecution.SUCCEEDED, reply.resource.message
    outputs = TypeEngine.literal_map_to_kwargs(ctx, LiteralMap.from_flyte_idl(reply.resource.outputs), {"o0": ScaleOutcome})
    assert outputs["o0"].effective == 1 and outputs["o0"].ready_workers == 1
    assert local_backend(local_env).get_state(ClusterRef.parse(nodes.CLUSTER)).ready_workers == 1


@pytest.mark.slow
def test_service_answers_bad_templates_and_metadata_with_a_short_failure(connector_service, local_env):
    """What FlytePropeller receives for a template or resource meta the connector refuses: a FAILED
    resource with a one-line message naming the field, not gRPC INTERNAL with a traceback."""
    stub = AsyncAgentServiceStub(connector_service)
    category = agent_pb2.TaskCategory(name="ddlscale_scale", version=0)
    template = get_serializable(OrderedDict(), SETTINGS, nodes.scale_up).template
    template.custom["timeout"] = 1e300
    created = stub.CreateTask(agent_pb2.CreateTaskRequest(template=template.to_flyte_idl(), output_prefix="/tmp/out"),
                              timeout=120)
    for meta in (created.resource_meta, b"{not json"):
        reply = stub.GetTask(agent_pb2.GetTaskRequest(task_category=category, resource_meta=meta), timeout=30)
        assert reply.resource.phase == TaskExecution.FAILED
        assert reply.resource.message.startswith("[invalid_input] invalid ")
        assert "\n" not in reply.resource.message and "Trace" not in reply.resource.message
    assert "timeout=1e+300" in stub.GetTask(
        agent_pb2.GetTaskRequest(task_category=category, resource_meta=created.resource_meta), timeout=30
    ).resource.message
    assert local_backend(local_env).list_clusters() == []
