"""The deployment mode: a stock `pyflyte serve connector` (no `--modules`: flytekit's start-up registers the
four task types through the plugin's entry point), called over gRPC for every node type (the local backend, or the scaler test server as the service's backend).

FlytePropeller speaks this protocol to the connector service: CreateTask
with the serialized template and input literals, then GetTask with the
returned resource meta until a terminal phase.
"""
import contextlib
import os
import signal
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
from google.protobuf import json_format

from flytekitplugins_ddlscale._services.nodes.scale import scale_line
from flytekitplugins_ddlscale.refs import ClusterRef
from flytekitplugins_ddlscale.tasks import WAIT_TASK_TYPE, RestartOutcome, RestoreOutcome, ScaleOutcome
from tests.flyte_apps import nodes
from tests.flyte_support import SCALER_ENV, local_backend, local_env  # noqa: F401 - fixture
from tests.port_support import free_ports
from tests.propeller_driver import refused_node
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
    with serving_process(env) as (channel, _):
        yield channel


def _serve_connector(env, port, prometheus, log):
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("pyflyte")), "serve", "connector", "--port", str(port),
         "--prometheus_port", str(prometheus)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )


@contextlib.contextmanager
def serving_process(env):
    """:func:`serving`, yielding the gRPC channel and the service's process."""
    for attempt in range(1, SERVE_ATTEMPTS + 1):
        port, prometheus = free_ports(2)
        # The service logs every request: into a file, since an unread pipe would fill and stall it.
        log = tempfile.TemporaryFile()
        proc = _serve_connector(env, port, prometheus, log)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            exited = wait_serving(channel, proc, log, 60.0, "pyflyte serve connector")
            if exited is None:
                yield channel, proc
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


HOSTILE_VALUES = (float("nan"), float("inf"), float("-inf"), 1e300, -1e300, [1], {"a": 1}, "")
"""Values of a template's configuration field no node accepts: those flytekit's own parse of the template
fails on (NaN, infinities) and those the node's check refuses."""
HOSTILE_FIELDS = ((nodes.scale_up, "replicas"), (nodes.scale_up, "timeout"), (nodes.scale_up, "strict"),
                  (nodes.scale_up, "head_hw_tier"), (nodes.restore, "replicas"))


def with_custom(template, field, value):
    """A copy of the flyteidl ``template`` whose ``custom[field]`` is ``value``, as a hand-made template holds it."""
    from google.protobuf import json_format
    from google.protobuf.struct_pb2 import Value

    changed = type(template)()
    changed.CopyFrom(template)
    if isinstance(value, float):
        changed.custom.fields[field].number_value = value
    else:
        changed.custom.fields[field].CopyFrom(json_format.ParseDict(value, Value()))
    return changed


def refused_details(channel, template) -> str:
    """The one line the node of ``template`` fails with under FlytePropeller (one attempt, FAILED at the first
    GetTask: :func:`~tests.propeller_driver.refused_node`)."""
    return refused_node(channel, template, None, template.type)


@pytest.mark.slow
def test_service_answers_bad_templates_and_metadata_with_a_short_failure(connector_service, local_env):
    """What FlytePropeller receives for a template or resource meta the connector refuses: CreateTask
    answers (FlytePropeller retries a failed one) and the first GetTask is FAILED naming the field; GetTask of
    bad metadata is FAILED with a one-line message naming the field; neither carries a traceback. That holds
    where flytekit's service itself cannot read the template (NaN or infinity anywhere in ``custom``, a
    metadata timeout out of range): the plugin answers for it, as for a template it refuses."""
    stub = AsyncAgentServiceStub(connector_service)
    category = agent_pb2.TaskCategory(name="ddlscale_scale", version=0)
    for task, field in HOSTILE_FIELDS:
        template = get_serializable(OrderedDict(), SETTINGS, task).template.to_flyte_idl()
        for value in HOSTILE_VALUES:
            details = refused_details(connector_service, with_custom(template, field, value))
            assert details.startswith(f"[invalid_input] invalid {field}="), (task.name, value, details)
    template = get_serializable(OrderedDict(), SETTINGS, nodes.scale_up).template.to_flyte_idl()
    details = refused_details(connector_service, with_custom(template, "timeout", 1e300))
    assert details.startswith("[invalid_input] invalid timeout=1e+300")
    details = refused_details(connector_service, with_custom(template, "unknown", [1.0, float("nan")]))
    assert details.startswith("[invalid_input] invalid custom.unknown[1]=nan; allowed: a finite number"), details
    template.metadata.timeout.seconds = 10**15
    details = refused_details(connector_service, template)
    assert details.startswith("[invalid_input] invalid template='OverflowError: "), details
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
    """An input literal of the wrong type or an input the node does not have: the node fails in one attempt, at
    its first GetTask, with the one line naming the input (not a traceback), and nothing is sent."""
    server, channel = scaler_service
    template = get_serializable(OrderedDict(), SETTINGS, ray_scale).template
    ctx = FlyteContextManager.current_context()
    server.clear_requests()
    for values, types, expected in (
        ({"replicas": "two"}, {"replicas": str}, "[invalid_input] invalid inputs.replicas='two': not convertible"),
        ({"nodes": 2}, {"nodes": int}, "[invalid_input] invalid inputs.nodes="),
    ):
        inputs = TypeEngine.dict_to_literal_map(ctx, values, types)
        line = refused_node(channel, template.to_flyte_idl(), inputs.to_flyte_idl(), template.type)
        assert line.startswith(expected), line
    assert server.requests == []


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


def _broken_backend_dist(folder: Path) -> Path:
    """A distribution on ``folder`` (for PYTHONPATH) registering backend ``broken``, whose module does not import."""
    info = folder / "ddlscale_broken_backend-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddlscale-broken-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[flytekitplugins_ddlscale.backends]\nbroken = ddlscale_absent_module:Backend\n")
    return folder


REFUSED_STARTS = {
    "unknown backend": ({"DDLSCALE_CONNECTOR_BACKENDS": "kubernets"},
                        "invalid DDLSCALE_CONNECTOR_BACKENDS='kubernets'; allowed: kubernetes, local, scaler"),
    "call budget": ({"DDLSCALE_CONNECTOR_CALL_BUDGET": "0"},
                    "invalid DDLSCALE_CONNECTOR_CALL_BUDGET='0'; allowed: a number of seconds > 0 and at most 9"),
    "dashboard link": ({"DDLSCALE_CONNECTOR_DASHBOARD_URL": "https://dashboards.example.com/{cluster}"},
                       "invalid DDLSCALE_CONNECTOR_DASHBOARD_URL='https://dashboards.example.com/{cluster}': it names "
                       "{cluster}; allowed: an http:// or https:// URL a browser reaches"),
    "policy that cannot be read": ({"DDLSCALE_CONNECTOR_POLICY": "/nonexistent/policy.yaml"},
                                   "invalid DDLSCALE_CONNECTOR_POLICY='/nonexistent/policy.yaml': [Errno 2] No such "
                                   "file or directory"),
    "backend that does not load": ({"DDLSCALE_CONNECTOR_BACKENDS": "broken"},
                                   "backend 'broken' does not load (ModuleNotFoundError: No module named "
                                   "'ddlscale_absent_module')"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(REFUSED_STARTS))
def test_a_configuration_no_call_could_be_served_under_stops_the_service_before_it_serves(case, tmp_path):
    """Read at the first call, such a configuration let the service answer health SERVING while every
    CreateTask was refused. The service exits non-zero before it listens, saying why in one line."""
    setting, expected = REFUSED_STARTS[case]
    env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
    env.update(setting, DDLSCALE_STATE_DIR=str(tmp_path / "state"))
    if "broken" in setting.values():
        env["PYTHONPATH"] = str(_broken_backend_dist(tmp_path / "site"))
    port, prometheus = free_ports(2)
    with tempfile.TemporaryFile() as log:
        proc = _serve_connector(env, port, prometheus, log)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            exited = wait_serving(channel, proc, log, 60.0, "pyflyte serve connector")
        finally:
            channel.close()
            stop_process(proc, 10)
    assert exited is not None, f"the service served with {setting}"
    assert proc.returncode == 1
    lines = [line for line in exited.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ddlscale connector: not starting: "), exited
    assert expected in lines[0]


def _until(condition, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"{what} did not happen within {timeout:g} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_turns_health_not_serving_lets_the_call_in_flight_finish_and_exits_0(tmp_path):
    """A rolling update's SIGTERM used to end the process at once: the GetTask in flight failed (one of the
    node's few failed syncs) and health never said NOT_SERVING. Now health turns NOT_SERVING at once and
    the poll held by a hung backend at that moment is answered once the backend answers, then the process
    exits 0 within its grace."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from flytekitplugins_ddlscale.connector_entry import SHUTDOWN_GRACE

    with ScalerTestServer() as server:
        server.add_cluster("ray", "drain-ray", replicas=1, max_replicas=4, min_replicas=None)
        env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
        env.update(CLUSTER_SCALER_BASE_URL=server.url, DOMINO_API_KEY=DEFAULT_API_KEY,
                   DDLSCALE_STATE_DIR=str(tmp_path / "connector-state"), DDLSCALE_CONNECTOR_CALL_BUDGET="9")
        with serving_process(env) as (channel, proc):
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            category = agent_pb2.TaskCategory(name=WAIT_TASK_TYPE, version=0)
            request = agent_pb2.GetTaskRequest(task_category=category,
                                               resource_meta=wait_meta("ray/drain-ray", "scaler", 1).encode())
            server.hang()
            try:
                call = AsyncAgentServiceStub(channel).GetTask.future(request, timeout=30)
                _until(lambda: server.count("GET") > 0, 30, "the poll's read reaching the scaler service")
                proc.send_signal(signal.SIGTERM)
                assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
                watch.cancel()
            finally:
                server.resume()
            answer = call.result()
            assert answer.resource.phase == TaskExecution.SUCCEEDED, answer.resource.message
            assert proc.wait(timeout=SHUTDOWN_GRACE + 30) == 0


@pytest.mark.slow
def test_what_flytepropeller_sends_to_the_ui_carries_the_waiting_summary_and_the_outcome(scaler_service):
    """FlytePropeller (v1.16.8) sends custom info and log links with the first answer of each phase, and
    drops the message of RUNNING and SUCCEEDED answers (docs/connector.md, "What the Flyte UI shows"). So
    the first RUNNING answer's custom info says what the node waits for, and the SUCCEEDED one's says what
    it did: the node's summary line, also the SUCCEEDED message."""
    server, channel = scaler_service
    stub = AsyncAgentServiceStub(channel)
    replies = get_until_done(stub, "ddlscale_scale", create(stub, ray_scale))
    first, last = replies[0].resource, replies[-1].resource
    assert first.phase == TaskExecution.RUNNING and last.phase == TaskExecution.SUCCEEDED, last.message
    waiting = json_format.MessageToDict(first.custom_info)
    assert waiting["summary"] == first.message and first.message.startswith("waiting for 3 workers")
    done = json_format.MessageToDict(last.custom_info)
    outcome = output(replies[-1], ScaleOutcome)
    assert done["summary"] == last.message == scale_line("ScaleCluster", outcome)
    assert last.message.startswith("ScaleCluster: ray/conn-ray 1 -> 3 workers")
    assert done["timeline"][-1][1] == 3  # the whole timeline, with the answer FlytePropeller sends


@pytest.mark.slow
def test_dashboard_links_point_where_the_setting_says_never_at_the_heads_cluster_address(tmp_path):
    """The KubeRay head as the Kubernetes backend reports it is kr-head-svc.domino-compute.svc: a link there
    opens nowhere in a browser. Unset, no link; with $DDLSCALE_CONNECTOR_DASHBOARD_URL, the link it says,
    filled in with the cluster and its head."""
    from tests.contract_support import write_kubeconfig
    from tests.servers.k8s_server import K8sTestServer
    from tests.test_connector import k8s_wait

    with K8sTestServer() as server:
        server.add_cluster("ray", "c1", replicas=1)
        server.add_kuberay("kr", groups=[{"groupName": "workers", "replicas": 2}])
        env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
        env.update(KUBECONFIG=str(write_kubeconfig(tmp_path / "kubeconfig", server.url)),
                   DDLSCALE_BACKEND="kubernetes", DDLSCALE_CONNECTOR_BACKENDS="kubernetes",
                   DDLSCALE_STATE_DIR=str(tmp_path / "state"))
        env.pop("KUBERNETES_SERVICE_HOST", None)
        links = {}
        for setting in ("", "https://dashboards.example.com/{namespace}/{service}:{port}/"):
            with serving(dict(env, DDLSCALE_CONNECTOR_DASHBOARD_URL=setting)) as channel:
                stub = AsyncAgentServiceStub(channel)
                category = agent_pb2.TaskCategory(name=WAIT_TASK_TYPE, version=0)
                reply = stub.GetTask(agent_pb2.GetTaskRequest(task_category=category, resource_meta=create(stub, k8s_wait)),
                                     timeout=30)
                # The head service has no DNS name here: the workers are up, the framework is not proven.
                assert "registered with the Ray head at http://kr-head-svc.domino-compute.svc:8265" in reply.resource.message
                links[setting] = [(link.name, link.uri) for link in reply.resource.log_links]
    assert links == {
        "": [],
        "https://dashboards.example.com/{namespace}/{service}:{port}/":
            [("Ray dashboard", "https://dashboards.example.com/domino-compute/kr-head-svc:8265")],
    }
