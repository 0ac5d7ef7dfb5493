"""FlytePropeller's contract, proven through the real connector service under backend faults.

A driver that behaves as FlytePropeller's web-API plugin does
(:mod:`tests.propeller_driver`: a deadline on every call, GetTask every
resync, a failure count never reset that gives the node up past its limit,
RUNNING messages dropped, DeleteTask on abort) runs ScaleCluster nodes
while the scaler service hangs, is killed and restarted, or its name stops
resolving. Here the faults are short and the clock is scaled down (call
budget 1 s, call deadline 3 s, resync 0.5 s, faults of 4 s: eight syncs,
more than FlytePropeller's five failures); ``test_connector_faults_long.py``
runs them for 60 s on FlytePropeller's own figures.

A backend that is already away when CreateTask comes (the scaler service
hung or killed, the Kubernetes API server down) must not fail the node
either: FlytePropeller would count a failed create against the node's
retries (none by default). Those runs give CreateTask FlytePropeller's own
deadline (10 s), since the connector's create waits out its own bound
(5 s) on a hung backend.
"""
import time

import pytest
from flyteidl.admin import agent_pb2
from flyteidl.core.execution_pb2 import TaskExecution
from flyteidl.service.agent_pb2_grpc import AsyncAgentServiceStub
from google.protobuf import json_format

from flytekitplugins_ddlscale.tasks import ScaleOutcome
from tests.connector_fault_support import (
    FAULTS, ProxyDown, StagedFault, fault_service, k8s_fault_service, k8s_scale_node, scale_node,
)
from tests.propeller_driver import CALL_TIMEOUT as PROPELLER_CALL_TIMEOUT
from tests.propeller_driver import PropellerDriver, refused_node, typed_output

pytestmark = pytest.mark.slow

BUDGET, CALL_TIMEOUT, RESYNC, FAULT = 1.0, 3.0, 0.5, 4.0
BEFORE_CREATE = 7.0
"""Seconds of a fault that starts before CreateTask: past the create's own bound (5 s)."""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with fault_service(tmp_path_factory.mktemp("faults"), BUDGET) as served:
        yield served


@pytest.mark.parametrize("kind", FAULTS)
def test_a_backend_fault_is_ridden_out_and_the_node_succeeds(service, kind):
    """No call fails while the backend is away; the node ends SUCCEEDED with its typed outcome once it is back."""
    server, channel, hosts = service
    template, inputs = scale_node(server, f"short-{kind}", timeout=120, pod_delay=1.0)
    fault = StagedFault(kind, server, hosts, FAULT)
    try:
        node = PropellerDriver(channel, resync=RESYNC, call_timeout=CALL_TIMEOUT).run(
            template, inputs, "ddlscale_scale", node_timeout=120, on_running=fault.on_running)
    finally:
        fault.close()
    assert fault.started.is_set() and fault.ended.is_set()
    assert node.failed_calls == [] and node.phase == "SUCCEEDED", (node.phase, node.message, node.failed_calls)
    outcome = typed_output(node.outputs, ScaleOutcome)
    assert isinstance(outcome, ScaleOutcome) and (outcome.previous_workers, outcome.workers) == (1, 3)
    assert node.custom_info["existing_workers"] == 3 and node.custom_info["desired_workers"] == 3
    assert node.log_links == [{"name": "Ray dashboard", "uri": "http://127.0.0.1:8265"}]


def _run_with_fault_from_create(channel, fault, template, inputs, node_timeout):
    """The scale node run under the driver with ``fault`` begun before its CreateTask and closed after it ends."""
    fault.begin()
    try:
        return PropellerDriver(channel, resync=RESYNC, call_timeout=PROPELLER_CALL_TIMEOUT).run(
            template, inputs, "ddlscale_scale", node_timeout=node_timeout)
    finally:
        fault.close()


def test_a_fault_outlasting_the_node_ends_it_failed_saying_what_it_waited_for(service):
    """The scaler service hangs past the node's timeout: the connector, not the failure count, ends it."""
    server, channel, hosts = service
    template, inputs = scale_node(server, "short-outlast", timeout=4, pod_delay=1.0)
    fault = StagedFault("hang", server, hosts, 60.0)
    try:
        node = PropellerDriver(channel, resync=RESYNC, call_timeout=CALL_TIMEOUT).run(
            template, inputs, "ddlscale_scale", node_timeout=60, on_running=fault.on_running)
    finally:
        fault.close()
    assert node.failed_calls == [] and node.phase == "FAILED", (node.phase, node.message, node.failed_calls)
    # The last poll's read and the poll's own wait both end at the call budget, so either may end the
    # node: the poll (timed out, what it last saw) or the read (the backend unavailable at the deadline).
    late = ("timed out after" in node.message and "did not answer within 1 s" in node.message
            and "last known: waiting for 3 workers" in node.message)
    unavailable = "[backend_unavailable]" in node.message
    assert (late or unavailable) and "\n" not in node.message, node.message
    # Either way the node says what the scale left in place and how to undo it.
    assert "spec.worker.replicas=3 left in place" in node.message and "restore_baseline" in node.message


@pytest.mark.parametrize("kind", ("hang", "restart"))
def test_a_scaler_service_away_before_create_does_not_fail_the_node(service, kind):
    """CreateTask meets the scaler service hung or killed: it answers (the scale is left to the polls),
    no call fails, and the node ends SUCCEEDED with its typed outcome once the service is back."""
    server, channel, hosts = service
    template, inputs = scale_node(server, f"before-{kind}", timeout=120, pod_delay=1.0)
    fault = StagedFault(kind, server, hosts, BEFORE_CREATE)
    node = _run_with_fault_from_create(channel, fault, template, inputs, node_timeout=120)
    assert fault.ended.is_set() and node.running_seen > 0
    assert node.failed_calls == [] and node.phase == "SUCCEEDED", (node.phase, node.message, node.failed_calls)
    outcome = typed_output(node.outputs, ScaleOutcome)
    assert isinstance(outcome, ScaleOutcome) and (outcome.previous_workers, outcome.workers) == (1, 3)
    assert server.cluster_object("ray", f"before-{kind}")["spec"]["worker"]["replicas"] == 3


@pytest.mark.parametrize("kind", ("hang", "restart"))
def test_a_scaler_service_away_from_create_past_the_deadline_fails_saying_the_scale_was_never_sent(service, kind):
    server, channel, hosts = service
    template, inputs = scale_node(server, f"never-{kind}", timeout=4, pod_delay=1.0)
    fault = StagedFault(kind, server, hosts, 60.0)  # ended by close(), once the node has ended
    node = _run_with_fault_from_create(channel, fault, template, inputs, node_timeout=60)
    assert node.failed_calls == [] and node.phase == "FAILED", (node.phase, node.message, node.failed_calls)
    assert node.message.startswith("failed to run the job: [timeout] ray/never-")
    assert "the scale was never sent: the backend was unavailable from create" in node.message
    assert "nothing was left in place" in node.message and "\n" not in node.message
    if kind == "restart":  # down throughout: nothing reached it (a hung service holds what it got)
        assert server.count("PATCH", "/never-restart") == 0
        assert server.cluster_object("ray", "never-restart")["spec"]["worker"]["replicas"] == 1


def test_a_kubernetes_api_server_down_before_create_does_not_fail_the_node(tmp_path):
    """CreateTask meets the Kubernetes API server down (connections refused; the connector has never
    reached it): no call fails and the node ends SUCCEEDED with its typed outcome once it is back."""
    with k8s_fault_service(tmp_path, BUDGET) as (server, channel, proxy):
        server.set_ready_delay(0.5)
        template, inputs = k8s_scale_node(server, "k8s-before", timeout=120)
        fault = ProxyDown(proxy, BEFORE_CREATE)
        node = _run_with_fault_from_create(channel, fault, template, inputs, node_timeout=120)
        assert fault.ended.is_set() and node.running_seen > 0
        assert node.failed_calls == [] and node.phase == "SUCCEEDED", (node.phase, node.message, node.failed_calls)
        outcome = typed_output(node.outputs, ScaleOutcome)
        assert (outcome.backend, outcome.previous_workers, outcome.workers) == ("kubernetes", 1, 3)
        assert server.count("PATCH") >= 1


def test_an_abort_calls_delete_task_and_it_answers(service):
    server, channel, hosts = service
    template, inputs = scale_node(server, "short-abort", timeout=60, pod_delay=30.0)
    node = PropellerDriver(channel, resync=RESYNC, call_timeout=CALL_TIMEOUT).run(
        template, inputs, "ddlscale_scale", node_timeout=1.0)
    assert node.phase == "ABORTED" and (node.calls[0].method, node.calls[-1].method) == ("CreateTask", "DeleteTask")
    assert node.failed_calls == []


def test_no_answer_carries_a_traceback_and_refused_templates_fail_at_the_first_get(service):
    """What FlytePropeller receives for hostile templates and metadata: CreateTask answers (FlytePropeller
    retries every failed one) and the first GetTask is FAILED naming the field (and its limit): one attempt
    where ``retries=1`` allows two, no request to the backend; GetTask of hostile metadata is FAILED with one
    line, DeleteTask answers; never a traceback."""
    server, channel, hosts = service
    stub = AsyncAgentServiceStub(channel)
    template, inputs = scale_node(server, "edge", timeout=60, pod_delay=1.0)
    server.clear_requests()  # the module's other tests share the service
    for name, value, expected in (
        ("cluster", "ray/" + "a" * 1_000_000, "longer than 255 characters"),
        ("framework_url", "http://" + "a" * 64 + ".example.com:8265", "invalid framework_url="),
        ("framework_url", "http://ex\u0430mple.com:8265", "an ASCII DNS name"),
    ):
        line = refused_node(channel, _with(template, name, value), inputs, "ddlscale_scale")
        assert line.startswith(f"[invalid_input] invalid {name}=") and expected in line, line
    assert server.requests == []
    category = agent_pb2.TaskCategory(name="ddlscale_scale", version=0)
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000  # the review's: refused by its size
    deep_but_small = b"[" * 30_000 + b"]" * 30_000  # under the size limit, past the parser's recursion limit
    for meta, expected in ((deep, "at most 65536 bytes"), (deep_but_small, "invalid resource_meta='<not JSON>'"),
                           (b" " * 1_000_000, "at most 65536 bytes")):
        reply = stub.GetTask(agent_pb2.GetTaskRequest(task_category=category, resource_meta=meta), timeout=30)
        assert reply.resource.phase == TaskExecution.FAILED and expected in reply.resource.message
        assert "\n" not in reply.resource.message and len(reply.resource.message) < 500
        stub.DeleteTask(agent_pb2.DeleteTaskRequest(task_category=category, resource_meta=meta), timeout=30)


def _with(template, name, value):
    changed = type(template)()
    changed.CopyFrom(template)
    changed.custom.fields[name].string_value = value
    return changed


def test_running_and_final_answers_carry_the_dashboard_and_the_counts(service):
    """The Flyte UI's view of a waiting node: log links (the Ray dashboard of the node's framework_url) and
    custom info (target, desired, existing and ready workers, the timeline) on RUNNING and on SUCCEEDED."""
    server, channel, hosts = service
    stub = AsyncAgentServiceStub(channel)
    template, inputs = scale_node(server, "shown", timeout=60, pod_delay=2.0)
    meta = stub.CreateTask(agent_pb2.CreateTaskRequest(template=template, inputs=inputs, output_prefix="/tmp/out"),
                           timeout=30).resource_meta
    category = agent_pb2.TaskCategory(name="ddlscale_scale", version=0)
    replies = []
    while not replies or replies[-1].phase == TaskExecution.RUNNING:
        assert len(replies) < 300, "the node did not end within 300 polls"
        replies.append(stub.GetTask(agent_pb2.GetTaskRequest(task_category=category, resource_meta=meta),
                                    timeout=30).resource)
        time.sleep(0.2)
    first, last = replies[0], replies[-1]
    assert first.phase == TaskExecution.RUNNING and last.phase == TaskExecution.SUCCEEDED, last.message
    for resource in (first, last):
        assert [(link.name, link.uri) for link in resource.log_links] == [("Ray dashboard", "http://127.0.0.1:8265")]
        info = json_format.MessageToDict(resource.custom_info)
        assert info["cluster"] == "ray/shown" and info["target_workers"] == 3 and info["desired_workers"] == 3
    timeline = json_format.MessageToDict(last.custom_info)["timeline"]
    assert timeline[0][1] == json_format.MessageToDict(first.custom_info)["existing_workers"] < 3
    assert timeline[-1][1] == 3 and [point[0] for point in timeline] == sorted(point[0] for point in timeline)
