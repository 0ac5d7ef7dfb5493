"""FlytePropeller's web-API plugin as a connector sees it, for tests: a node driven over gRPC.

Written from FlytePropeller v1.16.8's source (``flyteplugins/go/tasks/
pluginmachinery/internal/webapi``: ``launcher.go``, ``monitor.go``,
``cache.go``, ``core.go``; ``plugins/webapi/connector``: ``plugin.go``,
``client.go``, ``config.go``), in our own words:

- every call has a deadline (``defaultTimeout``, 10 s unless ``timeouts``
  says otherwise per call);
- CreateTask; an error (a gRPC status, the deadline) makes the attempt a
  retryable failure with "failed to create task from connector with ...",
  whatever the error (``launcher.go``'s ``launch``): the node's ``retries``
  run CreateTask again, and the last attempt's failure ends the node FAILED;
- then GetTask on every resync (``webApi.caching.resyncInterval``, 30 s by
  default, 5 s at least; smaller here only for fast tests). Each GetTask that
  errs or passes its deadline adds one to the item's failure count, which is
  never reset; a sync that finds the count above ``maxSystemFailures`` (5)
  marks the node a system failure without calling: "given up";
- a RUNNING answer's message is dropped (only QUEUED, INITIALIZING and
  WAITING_FOR_RESOURCES keep theirs); SUCCEEDED writes the outputs; FAILED
  becomes "failed to run the job: <message>", a permanent failure (no retry);
  log links and custom info are kept as the task's info;
- abort (the node's own timeout, or a user's) calls DeleteTask.
"""
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List

import grpc
from flyteidl.admin import agent_pb2
from flyteidl.core.execution_pb2 import TaskExecution
from flyteidl.service.agent_pb2_grpc import AsyncAgentServiceStub
from google.protobuf import json_format

CALL_TIMEOUT = 10.0
"""FlytePropeller's ``defaultTimeout`` for every connector call."""
RESYNC = 5.0
"""The shortest ``resyncInterval`` FlytePropeller accepts (its default is 30 s)."""
MAX_SYSTEM_FAILURES = 5
"""FlytePropeller's ``maxSystemFailures``: past it, the node is given up."""


@dataclass
class Call:
    """One call the driver made: its method, whether it failed (a gRPC error or the deadline), and why."""

    method: str
    failed: bool
    error: str = ""


@dataclass
class Node:
    """How a node ended under the driver: ``phase`` SUCCEEDED, FAILED, GIVEN_UP (past the failure count)
    or ABORTED, the message FlytePropeller would show, the outputs, and every call made."""

    phase: str = ""
    message: str = ""
    outputs: Any = None
    calls: List[Call] = field(default_factory=list)
    log_links: List[Dict[str, str]] = field(default_factory=list)
    custom_info: Dict[str, Any] = field(default_factory=dict)
    running_seen: int = 0
    attempts: int = 0
    """Attempts begun (CreateTask calls): more than one only where a CreateTask failed and ``retries`` allowed."""

    @property
    def failed_calls(self) -> List[Call]:
        return [call for call in self.calls if call.failed]


class PropellerDriver:
    """Drives one node through a connector at ``channel`` as FlytePropeller does (see the module)."""

    def __init__(
        self, channel: grpc.Channel, *, resync: float = RESYNC, call_timeout: float = CALL_TIMEOUT,
        max_system_failures: int = MAX_SYSTEM_FAILURES,
    ) -> None:
        self.stub = AsyncAgentServiceStub(channel)
        self.resync = resync
        self.call_timeout = call_timeout
        self.max_system_failures = max_system_failures

    def run(
        self, template: Any, inputs: Any, task_type: str, *, node_timeout: float, on_running: Any = None,
        on_created: Any = None, retries: int = 0,
    ) -> Node:
        """Create (again on a failed CreateTask, ``retries`` times at most), then sync every resync interval
        until a final phase, the failure count passes its limit or ``node_timeout`` (FlytePropeller's own
        deadline for the node: then DeleteTask, ABORTED). ``on_created(node)`` is called once CreateTask
        answered, ``on_running(node)`` after each RUNNING answer (where a test stages its faults)."""
        node = Node()
        started = time.monotonic()
        request = agent_pb2.CreateTaskRequest(template=template, inputs=inputs, output_prefix="/tmp/out")
        while True:
            node.attempts += 1
            try:
                meta = self.stub.CreateTask(request, timeout=self.call_timeout).resource_meta
                break
            except grpc.RpcError as error:
                node.calls.append(Call("CreateTask", True, error.details() or str(error.code())))
                if node.attempts > retries:
                    node.phase, node.message = "FAILED", f"failed to create task from connector with {error.details()}"
                    return node
        node.calls.append(Call("CreateTask", False))
        if on_created is not None:
            on_created(node)
        category = agent_pb2.TaskCategory(name=task_type, version=0)
        failures = 0
        while True:
            time.sleep(self.resync)
            if time.monotonic() - started > node_timeout:
                self._delete(node, category, meta)
                node.phase, node.message = "ABORTED", f"node timeout of {node_timeout:g} s expired"
                return node
            if failures > self.max_system_failures:
                node.phase = "GIVEN_UP"
                node.message = f"failed to sync {failures} times (more than {self.max_system_failures}): system failure"
                return node
            try:
                reply = self.stub.GetTask(
                    agent_pb2.GetTaskRequest(task_type=task_type, task_category=category, resource_meta=meta),
                    timeout=self.call_timeout,
                )
            except grpc.RpcError as error:
                failures += 1  # never reset, as cache.go's SyncFailureCount
                node.calls.append(Call("GetTask", True, error.details() or str(error.code())))
                continue
            node.calls.append(Call("GetTask", False))
            resource = reply.resource
            node.log_links = [{"name": link.name, "uri": link.uri} for link in resource.log_links]
            node.custom_info = json_format.MessageToDict(resource.custom_info) if resource.HasField("custom_info") else {}
            if resource.phase == TaskExecution.RUNNING:
                node.running_seen += 1  # the message is dropped (plugin.go's Status)
                if on_running is not None:
                    on_running(node)
                continue
            if resource.phase == TaskExecution.SUCCEEDED:
                node.phase, node.outputs = "SUCCEEDED", resource.outputs
                return node
            if resource.phase in (TaskExecution.FAILED, TaskExecution.RETRYABLE_FAILED, TaskExecution.ABORTED):
                node.phase, node.message = "FAILED", f"failed to run the job: {resource.message}"
                return node
            node.message = resource.message  # QUEUED / INITIALIZING / WAITING keep theirs

    def _delete(self, node: Node, category: Any, meta: bytes) -> None:
        try:
            self.stub.DeleteTask(
                agent_pb2.DeleteTaskRequest(task_type=category.name, task_category=category, resource_meta=meta),
                timeout=self.call_timeout,
            )
            node.calls.append(Call("DeleteTask", False))
        except grpc.RpcError as error:
            node.calls.append(Call("DeleteTask", True, error.details() or str(error.code())))

    def abort(self, task_type: str, meta: bytes) -> Node:
        """DeleteTask for ``meta``, as FlytePropeller aborts a node."""
        node = Node(phase="ABORTED")
        self._delete(node, agent_pb2.TaskCategory(name=task_type, version=0), meta)
        return node


def refused_node(channel: grpc.Channel, template: Any, inputs: Any, task_type: str, retries: int = 1) -> str:
    """The connector's one line for a node it refuses, as FlytePropeller meets it (the driver, ``retries``
    allowed): checked to end FAILED in one attempt (CreateTask answered, the first GetTask FAILED, nothing
    retried) with "failed to run the job: " and one line that carries no stack frame."""
    node = PropellerDriver(channel, resync=0.1).run(template, inputs, task_type, node_timeout=60, retries=retries)
    assert [(call.method, call.failed) for call in node.calls] == [("CreateTask", False), ("GetTask", False)], node
    assert node.phase == "FAILED" and node.attempts == 1 and node.message.startswith("failed to run the job: "), node
    line = node.message[len("failed to run the job: "):]
    assert "\n" not in line and "Traceback" not in line and 'File "' not in line and len(line) < 2000, line[:3000]
    return line


def typed_output(outputs: Any, kind: type) -> Any:
    """Output ``o0`` of a SUCCEEDED answer as ``kind`` (flytekit's type engine, as the next node reads it)."""
    from flytekit import FlyteContextManager
    from flytekit.core.type_engine import TypeEngine
    from flytekit.models.literals import LiteralMap

    ctx = FlyteContextManager.current_context()
    return TypeEngine.literal_map_to_kwargs(ctx, LiteralMap.from_flyte_idl(outputs), {"o0": kind})["o0"]

