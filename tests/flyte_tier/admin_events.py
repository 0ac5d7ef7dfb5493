"""Where FlytePropeller's events go in the flyte tier: flyteadmin's event API, served here and recorded.

FlytePropeller reports every workflow, node and task phase change to
flyteadmin's ``AdminService`` (``CreateWorkflowEvent``, ``CreateNodeEvent``,
``CreateTaskEvent``): what the UI shows is what these calls carry. flyteadmin
itself cannot be built here (the Go module proxy serves no version of
``github.com/flyteorg/flyte/flyteadmin``), so :class:`EventRecorder` answers
those three calls on a loopback port and keeps each request as FlytePropeller
sent it; every other AdminService call answers UNIMPLEMENTED.
"""
import threading
import time
from concurrent import futures
from typing import Any, Callable, List, Optional

import grpc
from flyteidl.admin import event_pb2
from flyteidl.event import event_pb2 as events
from flyteidl.service import admin_pb2_grpc


class EventRecorder(admin_pb2_grpc.AdminServiceServicer):
    """AdminService's event calls on ``127.0.0.1:<port>``; ``workflow_events``, ``node_events`` and
    ``task_events`` hold what arrived, in order. Use as a context manager."""

    def __init__(self) -> None:
        self.workflow_events: List[events.WorkflowExecutionEvent] = []
        self.node_events: List[events.NodeExecutionEvent] = []
        self.task_events: List[events.TaskExecutionEvent] = []
        self.task_received: List[float] = []
        """When each of ``task_events`` arrived here (``time.time()``): when flyteadmin would have heard of it."""
        self._changed = threading.Condition()
        self._server: Optional[grpc.Server] = None
        self.port = 0

    def start(self) -> "EventRecorder":
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        admin_pb2_grpc.add_AdminServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)

    def __enter__(self) -> "EventRecorder":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _keep(self, into: List[Any], event: Any) -> None:
        with self._changed:
            into.append(event)
            self._changed.notify_all()

    def CreateWorkflowEvent(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        self._keep(self.workflow_events, request.event)
        return event_pb2.WorkflowExecutionEventResponse()

    def CreateNodeEvent(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._keep(self.node_events, request.event)
        return event_pb2.NodeExecutionEventResponse()

    def CreateTaskEvent(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self._changed:
            self.task_received.append(time.time())
            self._keep(self.task_events, request.event)
        return event_pb2.TaskExecutionEventResponse()

    def wait_for(self, found: Callable[[], Any], what: str, timeout: float) -> Any:
        """``found()``'s first truthy answer, re-asked each time an event arrives; AssertionError naming
        ``what`` after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        with self._changed:
            while True:
                answer = found()
                if answer:
                    return answer
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no event showed {what} within {timeout:g} s")
                self._changed.wait(left)

    def tasks_of(self, execution: str, node: Optional[str] = None) -> List[events.TaskExecutionEvent]:
        """The task events of execution ``execution`` (its name), of node ``node`` if given, in order."""
        with self._changed:
            return [e for e in self.task_events
                    if e.parent_node_execution_id.execution_id.name == execution
                    and (node is None or e.parent_node_execution_id.node_id == node)]
