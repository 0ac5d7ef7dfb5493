"""The Flyte 2 connector over real gRPC: flyte's connector server (``c0``) in a subprocess, called with
flyteidl2's generated stubs, against a real local Dask cluster.

The server is flyte's own command: it loads the connectors of every
``flyte.connectors`` entry point (ours among them) and serves flyteidl2's
``AsyncConnectorService`` and ``ConnectorMetadataService``. The test is a
FlytePropeller stand-in: ``CreateTask`` with a ``ddlscale_*`` template and
input literals, ``GetTask`` with the stored bytes until the phase is
final, outputs read back as the node's typed outcome.
"""
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

flyte = pytest.importorskip("flyte", reason="the Flyte 2 connector needs the flyte2 extra (pip install -e '.[flyte2]')")

import grpc  # noqa: E402
from flyteidl2.connector import service_pb2_grpc  # noqa: E402
from flyteidl2.connector.connector_pb2 import (  # noqa: E402
    CreateTaskRequest,
    GetTaskRequest,
    ListConnectorsRequest,
    TaskCategory,
)
from flyteidl2.core import interface_pb2, tasks_pb2  # noqa: E402
from flyteidl2.core.execution_pb2 import TaskExecution  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from google.protobuf.struct_pb2 import Struct  # noqa: E402

from flytekitplugins_ddlscale._services.nodes.names import TASK_TYPES  # noqa: E402
from flytekitplugins_ddlscale._services.nodes.restore import RESTORE_TASK_TYPE, RestoreConfig, RestoreOutcome  # noqa: E402
from flytekitplugins_ddlscale._services.nodes.scale import SCALE_TASK_TYPE, ScaleConfig, ScaleOutcome  # noqa: E402
from flytekitplugins_ddlscale.refs import ClusterRef  # noqa: E402
from tests.flyte_support import local_backend, local_env, processes_mentioning  # noqa: E402,F401 - fixture
from tests.port_support import free_ports  # noqa: E402

pytestmark = pytest.mark.slow
CLUSTER = "dask/flyte2-grpc"
SERVER_START = 90.0
"""Seconds the connector server gets to answer its first call (it imports flyte and the plugin)."""
NODE_LIMIT = 120.0
"""Seconds a node gets to reach a final phase over the polls."""


@pytest.fixture
def connector_server(local_env, tmp_path):
    """flyte's connector server ``c0`` serving the local backend (listed, as a deployment must), on free
    ports; yields a channel to it. Stopped at teardown (SIGTERM, then SIGKILL), nothing left running."""
    port, metrics = free_ports(2)
    env = dict(os.environ, DDLSCALE_CONNECTOR_BACKENDS="local", DDLSCALE_STATE_DIR=str(local_env),
               DDLSCALE_CONNECTOR_DASHBOARD_URL="http://{host}:{port}")  # the heads are on this machine
    c0 = Path(sys.executable).with_name("c0")
    log = (tmp_path / "c0.log").open("w")
    proc = subprocess.Popen([str(c0), "--port", str(port), "--prometheus_port", str(metrics)],
                            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        try:
            grpc.channel_ready_future(channel).result(timeout=SERVER_START)
        except grpc.FutureTimeoutError:
            pytest.fail(f"the connector server did not accept a connection on port {port} within {SERVER_START:g} s: "
                        + (tmp_path / "c0.log").read_text()[-3000:])
        yield channel
    finally:
        channel.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        log.close()
    assert processes_mentioning(f"--port {port}") == []


def test_c0_with_a_policy_it_cannot_read_stops_in_one_line(local_env, tmp_path):
    """flyte's server only warns about a connector that fails to load and serves on without it: ours stops the
    server at start-up instead, in one line, as `pyflyte serve connector` does (never at the first call)."""
    port, metrics = free_ports(2)
    env = dict(os.environ, DDLSCALE_CONNECTOR_BACKENDS="local", DDLSCALE_STATE_DIR=str(local_env),
               DDLSCALE_CONNECTOR_POLICY=str(tmp_path / "missing.yaml"))
    c0 = Path(sys.executable).with_name("c0")
    out = subprocess.run([str(c0), "--port", str(port), "--prometheus_port", str(metrics)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=SERVER_START)
    lines = [line for line in out.stderr.splitlines() if line.startswith("ddlscale connector:")]
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-3000:]
    assert "not starting" in lines[0] and "DDLSCALE_CONNECTOR_POLICY" in lines[0] and "Traceback" not in out.stderr


def template(task_type, config, inputs):
    """A ``task_type`` template whose ``custom`` is ``config`` and whose interface declares ``inputs``."""
    from flyte.types import TypeEngine

    variables = [interface_pb2.VariableEntry(key=name, value=interface_pb2.Variable(type=TypeEngine.to_literal_type(kind)))
                 for name, kind in inputs.items()]
    return tasks_pb2.TaskTemplate(
        type=task_type, custom=json_format.ParseDict(config.to_custom(), Struct()),
        interface=interface_pb2.TypedInterface(inputs=interface_pb2.VariableMap(variables=variables)),
    )


def input_literals(**values):
    """The input literals Flyte 2 sends for ``values`` (int inputs here), through flyte's own conversion."""
    from flyte._internal.runtime.convert import convert_from_native_to_inputs
    from flyte.models import NativeInterface

    interface = NativeInterface.from_types({name: (type(value), None) for name, value in values.items()}, {})
    return asyncio.run(convert_from_native_to_inputs(interface, **values)).proto_inputs


HOSTILE_VALUES = (float("nan"), float("inf"), float("-inf"), 1e300, -1e300, [1], {"a": 1}, "")
"""Values no node accepts in its numeric, boolean or tier fields (as tests/test_connector_service.py sends flytekit's)."""


def with_custom(task, field, value):
    """A copy of ``task`` whose ``custom[field]`` is ``value``, as a hand-made template holds it."""
    from google.protobuf.struct_pb2 import Value

    changed = tasks_pb2.TaskTemplate()
    changed.CopyFrom(task)
    if isinstance(value, float):
        changed.custom.fields[field].number_value = value
    else:
        changed.custom.fields[field].CopyFrom(json_format.ParseDict(value, Value()))
    return changed


def run_node(channel, task_type, task, inputs):
    """CreateTask, then GetTask every 0.5 s until the phase is final; the final resource."""
    stub = service_pb2_grpc.AsyncConnectorServiceStub(channel)
    created = stub.CreateTask(CreateTaskRequest(template=task, inputs=inputs), timeout=30)
    deadline = time.monotonic() + NODE_LIMIT
    while True:
        got = stub.GetTask(GetTaskRequest(task_category=TaskCategory(name=task_type), resource_meta=created.resource_meta),
                           timeout=30)
        if got.resource.phase not in (TaskExecution.RUNNING, TaskExecution.QUEUED, TaskExecution.INITIALIZING):
            return got.resource
        assert time.monotonic() < deadline, f"{task_type} still {got.resource.message} after {NODE_LIMIT:g} s"
        time.sleep(0.5)


def outcome(resource, kind):
    """Output ``o0`` of ``resource`` as ``kind`` (flyte's type engine, as a parent task reads it)."""
    from flyte.types import TypeEngine

    (literal,) = [entry.value for entry in resource.outputs.literals if entry.name == "o0"]
    return asyncio.run(TypeEngine.to_python_value(literal, kind))


def test_c0_serves_every_node_type_and_scales_and_restores_real_dask_over_grpc(connector_server, local_env):
    listed = service_pb2_grpc.ConnectorMetadataServiceStub(connector_server).ListConnectors(ListConnectorsRequest(),
                                                                                           timeout=30)
    (ours,) = [c for c in listed.connectors if c.name == "ddlscale connector"]
    assert sorted(c.name for c in ours.supported_task_categories) == sorted(TASK_TYPES)

    scale = template(SCALE_TASK_TYPE, ScaleConfig(cluster=CLUSTER, replicas=1, timeout=90), {"replicas": int})
    resource = run_node(connector_server, SCALE_TASK_TYPE, scale, input_literals(replicas=2))
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    up = outcome(resource, ScaleOutcome)
    # The input literal (2), not the definition's 1; waited for until the Dask scheduler had them.
    assert (up.previous_workers, up.effective, up.ready_workers, up.waited) == (0, 2, 2, True)
    assert "registered with the Dask scheduler" in up.readiness
    assert local_backend(local_env).get_state(ClusterRef.parse(CLUSTER)).ready_workers == 2
    # What the Flyte UI shows: the Dask dashboard the local backend reports, and the counts.
    (link,) = resource.log_links
    assert link.name == "Dask dashboard" and link.uri.startswith("http://127.0.0.1:") and link.uri.endswith("/status")
    info = json_format.MessageToDict(resource.custom_info)
    assert (info["cluster"], info["target_workers"], info["ready_workers"]) == (CLUSTER, 2, 2)
    assert info["timeline"][-1][1] == 2

    restore = template(RESTORE_TASK_TYPE, RestoreConfig(cluster=CLUSTER, replicas=0, timeout=90), {})
    resource = run_node(connector_server, RESTORE_TASK_TYPE, restore, input_literals())
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    back = outcome(resource, RestoreOutcome)
    assert (back.restored, back.previous_workers, back.workers) == ("given size", 2, 0)
    assert local_backend(local_env).get_state(ClusterRef.parse(CLUSTER)).desired_workers == 0


def test_an_invalid_input_over_grpc_fails_the_node_naming_the_field_and_starts_nothing(connector_server, local_env):
    """A refused input, a hostile template (NaN, infinite, huge or ill-typed ``replicas``, ``timeout``,
    ``strict``, ``head_hw_tier`` or a restore's ``replicas``; a 64-letter or Cyrillic head host) is answered at
    CreateTask (a failed create is one a retry may get past) with a metadata whose first GetTask is FAILED with
    one line naming the field; hostile metadata is FAILED at GetTask; no answer carries a traceback."""
    stub = service_pb2_grpc.AsyncConnectorServiceStub(connector_server)
    scale = template(SCALE_TASK_TYPE, ScaleConfig(cluster=CLUSTER, replicas=1), {"replicas": int})
    restore = template(RESTORE_TASK_TYPE, RestoreConfig(cluster=CLUSTER), {})
    fields = [(scale, "replicas"), (scale, "timeout"), (scale, "strict"), (scale, "head_hw_tier"), (restore, "replicas")]
    hostile = [(task, name, value) for task, name in fields for value in HOSTILE_VALUES]
    hostile += [(scale, "framework_url", "http://" + "a" * 64 + ".example.com:8265"),
                (scale, "framework_url", "http://ex\u0430mple.com:8265")]
    requests = [(with_custom(task, name, value), input_literals(replicas=1) if task is scale else None, name)
                for task, name, value in hostile]
    requests.append((scale, input_literals(replicas=-3), "replicas"))
    for task, inputs, field in requests:
        meta = stub.CreateTask(CreateTaskRequest(template=task, inputs=inputs), timeout=30).resource_meta
        got = stub.GetTask(GetTaskRequest(task_category=TaskCategory(name=task.type), resource_meta=meta), timeout=30)
        message = got.resource.message
        assert got.resource.phase == TaskExecution.FAILED, (field, got.resource)
        assert message.startswith(f"[invalid_input] invalid {field}=") and "\n" not in message, message
    deep = b"[" * 30_000 + b"]" * 30_000
    got = stub.GetTask(GetTaskRequest(task_category=TaskCategory(name=SCALE_TASK_TYPE), resource_meta=deep), timeout=30)
    assert got.resource.phase == TaskExecution.FAILED and got.resource.message.startswith("[invalid_input] invalid resource_meta")
    assert local_backend(local_env).list_clusters() == []