"""The deployment mode: a stock `pyflyte serve connector` (no `--modules`: flytekit's start-up registers the
four task types through the plugin's entry point), called over gRPC for every node type (the local backend, or the scaler test server as the service's backend).

FlytePropeller speaks this protocol to the connector service: CreateTask
with the serialized template and input literals, then GetTask with the
returned resource meta until a terminal phase.
"""
import contextlib
import os
import subprocess
import sys
import tempfile
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
from flytekitplugins_ddlscale.tasks import WAIT_TASK_TYPE, RestartOutcome, RestoreOutcome, ScaleOutcome
from tests.flyte_apps import nodes
from tests.flyte_support import SCALER_ENV, local_backend, local_env  # noqa: F401 - fixture
from tests.port_support import free_ports
from tests.served_process import stop_process, wait_serving
from tests.servers.scaler_server import DEFAULT_API_KEY, ScalerTestServer
from tests.test_connector import ray_restart, ray_restore, ray_scale
from tests.test_connector_fleet import wait_meta


ROOT = Path(__file__).resolve().parent.parent
SETTINGS = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))


SERVE_ATTEMPTS = 3
"""Starts of the service on new ports when a port chosen free was taken before the service bound it
(other tests run beside this one)."""


@contextlib.contextmanager
def serving(env):
    """A stock ``pyflyte serve connector`` in its own process with ``env`` (the plugin found through its
    ``flytekit.plugins`` entry point, as in a deployment); yields a gRPC channel to it."""
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    for attempt in range(1, SERVE_ATTEMPTS + 1):
        port, prometheus = free_ports(2)
        # The service logs every request: into a file, since an unread pipe would fill and stall it.
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("pyflyte")), "serve", "connector", "--port", str(port),
             "--prometheus_port", str(prometheus)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            exited = wait_serving(channel, proc, log, 60.0, "pyflyte serve connector")
            if exited is None:
                yield channel
                return
            if "address already in use" not in exited.lower() or attempt == SERVE_ATTEMPTS:
                raise AssertionError(f"pyflyte serve connector exited with {proc.returncode} before serving:\n{exited}")
        finally:
            channel.close()
            stop_process(proc, 10)
            log.close()


@pytest.fixture
def connector_service(local_env):
    """The connector service serving the local backend (served only when listed)."""
    env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV}
    env["DDLSCALE_CONNECTOR_BACKENDS"] = "local"
    with serving(env) as channel:
        yield channel


@pytest.fixture
def scaler_service(tmp_path):
    """The scaler test server with ray/conn-ray, and the connector service using it as its backend."""
    with ScalerTestServer(pod_ready_delay=0.5) as server:
        server.add_cluster("ray", "conn-ray", replicas=1, max_replicas=4, min_replicas=None)
        env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
        env.update(CLUSTER_SCALER_BASE_URL=server.url, DOMINO_API_KEY=DEFAULT_API_KEY,
                   DDLSCALE_STATE_DIR=str(tmp_path / "connector-state"))
        with serving(env) as channel:
            yield server, channel


def create(stub, task, **values):
    """CreateTask for ``task``'s template with ``values`` as its input literals; the resource meta."""
    template = get_serializable(OrderedDict(), SETTINGS, task).template
    ctx = FlyteContextManager.current_context()
    inputs = TypeEngine.dict_to_literal_map(ctx, values, {k: task.python_interface.inputs[k] for k in values})
    request = agent_pb2.CreateTaskRequest(template=template.to_flyte_idl(), inputs=inputs.to_flyte_idl(),
                                          output_prefix="/tmp/out")
    return stub.CreateTask(request, timeout=30).resource_meta


def get_until_done(stub, task_type, meta, limit=60.0):
    """GetTask every 0.2 s until the phase is not RUNNING (or ``limit`` passes); the replies seen."""
    category = agent_pb2.TaskCategory(name=task_type, version=0)
    deadline = time.monotonic() + limit
    replies = []
    while True:
        replies.append(stub.GetTask(agent_pb2.GetTaskRequest(task_category=category, resource_meta=meta), timeout=30))
        if replies[-1].resource.phase != TaskExecution.RUNNING or time.monotonic() > deadline:
            return replies
        time.sleep(0.2)


def output(reply, kind):
    ctx = FlyteContextManager.current_context()
    return TypeEngine.literal_map_to_kwargs(ctx, LiteralMap.from_flyte_idl(reply.resource.outputs), {"o0": kind})["o0"]


@pytest.mark.slow
def test_service_lists_the_connector_and_scales_over_grpc(connector_service, local_env):
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # the connector extra: the health checks deployments probe

    health = health_pb2_grpc.HealthStub(connector_service).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    agents = AgentMetadataServiceStub(connector_service).ListAgents(agent_pb2.ListAgentsRequest(), timeout=30)
    served = {c.name for a in agents.agents for c in a.supported_task_categories}
    assert {name for name in served if name.startswith("ddlscale_")} == {
        "ddlscale_scale", "ddlscale_wait", "ddlscale_restore", "ddlscale_restart_head"}

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
    """What FlytePropeller receives for a template or resource meta the connector refuses: CreateTask
    fails naming the field (the node ends at create), GetTask of bad metadata is FAILED with a one-line
    message naming the field; neither carries a traceback."""
    stub = AsyncAgentServiceStub(connector_service)
    category = agent_pb2.TaskCategory(name="ddlscale_scale", version=0)
    template = get_serializable(OrderedDict(), SETTINGS, nodes.scale_up).template
    template.custom["timeout"] = 1e300
    with pytest.raises(grpc.RpcError) as caught:
        stub.CreateTask(agent_pb2.CreateTaskRequest(template=template.to_flyte_idl(), output_prefix="/tmp/out"),
                        timeout=120)
    details = caught.value.details()
    assert "[invalid_input] invalid timeout=1e+300" in details and "Traceback" not in details and 'File "' not in details
    reply = stub.GetTask(agent_pb2.GetTaskRequest(task_category=category, resource_meta=b"{not json"), timeout=30)
    assert reply.resource.phase == TaskExecution.FAILED
    assert reply.resource.message.startswith("[invalid_input] invalid resource_meta")
    assert "\n" not in reply.resource.message and "Trace" not in reply.resource.message
    assert local_backend(local_env).list_clusters() == []


@pytest.mark.slow
def test_service_scales_restores_and_restarts_once_over_grpc(scaler_service):
    """ScaleCluster, RestoreCluster and RestartHead nodes through the real service: each CreateTask sends
    its change once, GetTask polls observe it, and the typed outcome comes back."""
    server, channel = scaler_service
    stub = AsyncAgentServiceStub(channel)
    scaled = get_until_done(stub, "ddlscale_scale", create(stub, ray_scale))[-1]
    assert scaled.resource.phase == TaskExecution.SUCCEEDED, scaled.resource.message
    assert output(scaled, ScaleOutcome).workers == 3

    server.clear_requests()
    replies = get_until_done(stub, "ddlscale_restore", create(stub, ray_restore))
    assert replies[-1].resource.phase == TaskExecution.SUCCEEDED, replies[-1].resource.message
    restored = output(replies[-1], RestoreOutcome)
    assert (restored.restored, restored.previous_workers, restored.workers) == ("baseline", 3, 1)
    assert server.count("PATCH", "/scale/") == 1

    server.head_recreate_delay = server.head_ready_delay = 1.0
    meta = create(stub, ray_restart)
    replies = get_until_done(stub, "ddlscale_restart_head", meta)
    assert replies[0].resource.phase == TaskExecution.RUNNING and len(replies) > 2
    assert replies[-1].resource.phase == TaskExecution.SUCCEEDED, replies[-1].resource.message
    assert output(replies[-1], RestartOutcome).ready
    for _ in range(3):  # more polls, as a slow FlytePropeller would send
        get_until_done(stub, "ddlscale_restart_head", meta)
    assert server.count("PATCH", "/restart_head/") == 1


@pytest.mark.slow
def test_service_answers_malformed_inputs_with_a_short_failure(scaler_service):
    """An input literal of the wrong type or an input the node does not have: CreateTask fails with the
    one line naming the input (not a traceback), and nothing is sent."""
    server, channel = scaler_service
    stub = AsyncAgentServiceStub(channel)
    template = get_serializable(OrderedDict(), SETTINGS, ray_scale).template
    ctx = FlyteContextManager.current_context()
    for values, types, expected in (
        ({"replicas": "two"}, {"replicas": str}, "[invalid_input] invalid inputs.replicas='two': not convertible"),
        ({"nodes": 2}, {"nodes": int}, "[invalid_input] invalid inputs.nodes="),
    ):
        inputs = TypeEngine.dict_to_literal_map(ctx, values, types)
        with pytest.raises(grpc.RpcError) as caught:
            stub.CreateTask(agent_pb2.CreateTaskRequest(template=template.to_flyte_idl(), inputs=inputs.to_flyte_idl(),
                                                        output_prefix="/tmp/out"), timeout=30)
        assert expected in caught.value.details() and 'File "' not in caught.value.details()
    assert server.count("PATCH") == 0


POLLED_AT_ONCE = 200
"""Executions whose polls reach the service at once: more than the loop's executor (``min(32, CPUs + 4)``
threads) can wait out a hung backend's call budget for within FlytePropeller's deadline, on any machine."""
PROPELLER_DEADLINE = 10.0
"""FlytePropeller's deadline for each GetTask (its web-API plugin's default)."""


@pytest.mark.slow
def test_polls_of_a_hung_backend_hold_no_thread_of_the_service(tmp_path):
    """Each poll of a hung backend waits out the call budget. Were the wait a thread of the service loop's
    executor, a few such polls would hold all of them and the rest would queue past FlytePropeller's
    deadline (a failed GetTask, and a node given up after a few). Every one of 200 executions polled at
    once gets its answer within the deadline: RUNNING, saying the backend did not answer in the budget."""
    with ScalerTestServer() as server:
        env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
        env.update(CLUSTER_SCALER_BASE_URL=server.url, DOMINO_API_KEY=DEFAULT_API_KEY,
                   DDLSCALE_STATE_DIR=str(tmp_path / "connector-state"), DDLSCALE_CONNECTOR_CALL_BUDGET="2")
        with serving(env) as channel:
            stub = AsyncAgentServiceStub(channel)
            category = agent_pb2.TaskCategory(name=WAIT_TASK_TYPE, version=0)
            server.hang()
            try:
                calls = [
                    stub.GetTask.future(agent_pb2.GetTaskRequest(
                        task_category=category, resource_meta=wait_meta(f"ray/hung-{index}", "scaler", 2).encode(),
                    ), timeout=PROPELLER_DEADLINE)
                    for index in range(POLLED_AT_ONCE)
                ]
                answers, failed = [], []
                for call in calls:
                    try:
                        answers.append(call.result())
                    except grpc.RpcError as error:
                        failed.append(error.code())
            finally:
                server.resume()
    assert failed == [], f"{len(failed)} of {POLLED_AT_ONCE} polls failed: {sorted(set(map(str, failed)))}"
    assert {answer.resource.phase for answer in answers} == {TaskExecution.RUNNING}
    # Either the desk's budget ran out first, or the read's own (its timeout, or the shared poll's).
    unanswered = ("the backend did not answer within 2 s", "backend unavailable, reading again: [backend_unavailable]")
    assert [a.resource.message for a in answers if not a.resource.message.startswith(unanswered)] == []
