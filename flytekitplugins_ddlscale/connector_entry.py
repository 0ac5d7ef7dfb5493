"""flytekit's entry point (``flytekit.plugins``, imported in every flytekit process): a
:class:`DeferredConnector` per ``ddlscale_*`` task type, which loads the connector at its first call. In
``pyflyte serve connector`` the import also checks what it will serve and drains at SIGTERM
(:func:`prepare_service`; docs/connector.md).
"""
import asyncio
import importlib
import inspect
import logging
import os
import signal
import sys
import threading
from concurrent import futures
from typing import Any, List, Optional, Sequence

from flytekit.exceptions.system import FlyteConnectorNotFound
from flytekit.extend.backend.base_connector import AsyncConnectorBase, ConnectorRegistry, Resource, ResourceMeta

from ._services.nodes.names import TASK_TYPES

__all__ = ["CONNECTOR_MODULE", "CONNECTOR_NAME", "SHUTDOWN_GRACE", "DeferredConnector", "prepare_service",
           "register", "serving"]

CONNECTOR_MODULE = "flytekitplugins_ddlscale.connector"
"""The module whose ``ScalingConnector`` answers the calls."""
CONNECTOR_NAME = "ddlscale connector"
"""The name ``ListAgents`` gives the four task types (``ScalingConnector.name``)."""
SHUTDOWN_GRACE = 10.0
"""Seconds the calls in flight at SIGTERM get to finish: FlytePropeller's deadline for each call, more than
any call takes, and under Kubernetes' default ``terminationGracePeriodSeconds`` (30)."""

logger = logging.getLogger("flytekitplugins_ddlscale.connector")


class DeferredConnector(AsyncConnectorBase):
    """Stands in flytekit's registry for one ``ddlscale_*`` task type: every call goes to one ``ScalingConnector``
    of that type, built at the first call (under a lock: the service calls from a thread pool)."""

    name = CONNECTOR_NAME

    def __init__(self, task_type: str) -> None:
        if task_type not in TASK_TYPES:
            raise ValueError(f"task_type must be one of {TASK_TYPES}, not {task_type!r}")
        super().__init__(task_type_name=task_type, metadata_type=ResourceMeta)
        self._connector: Optional[AsyncConnectorBase] = None
        self._lock = threading.Lock()

    @property
    def connector(self) -> AsyncConnectorBase:
        """The ``ScalingConnector`` that answers for this task type (imported and built on first use)."""
        with self._lock:
            if self._connector is None:
                module = importlib.import_module(CONNECTOR_MODULE)
                self._connector = module.ScalingConnector(self.task_category.name)
            return self._connector

    @property
    def metadata_type(self) -> Any:
        """The connector's resource metadata class (the service decodes GetTask's and DeleteTask's bytes with it)."""
        return self.connector.metadata_type

    def create(self, task_template: Any, output_prefix: str = "", inputs: Any = None,
               task_execution_metadata: Any = None, **kwargs: Any) -> ResourceMeta:
        """The connector's ``create``: what ``get`` will need."""
        return self.connector.create(task_template, output_prefix, inputs, task_execution_metadata, **kwargs)

    async def get(self, resource_meta: ResourceMeta, **kwargs: Any) -> Resource:
        """The connector's ``get`` (a coroutine, as the service awaits it on its event loop): the node's
        phase, message and outputs."""
        # The first call imports the connector: in a thread, so the loop's other calls go on meanwhile.
        connector = self._connector or await asyncio.to_thread(lambda: self.connector)
        return await connector.get(resource_meta, **kwargs)

    def delete(self, resource_meta: ResourceMeta, **kwargs: Any) -> None:
        """The connector's ``delete``."""
        self.connector.delete(resource_meta, **kwargs)


def serving(argv: Optional[Sequence[str]] = None) -> bool:
    """Whether ``argv`` (this process's) starts flytekit's connector service: ``pyflyte [options] serve connector``
    (or its older name, ``serve agent``)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv or not os.path.basename(argv[0]).startswith("pyflyte"):
        return False
    words = argv[1:]
    return any(words[i] == "serve" and words[i + 1] in ("connector", "agent") for i in range(len(words) - 1))


def prepare_service() -> None:
    """In the connector service, before it serves: check what it will serve, or exit with one line
    (:func:`~._services.connector_policy.served_at_start`), and have flytekit's server drain at SIGTERM."""
    from ._services.connector_policy import start_lines

    ok, lines = start_lines()
    print(*lines, sep="\n", file=sys.stderr, flush=True)
    if not ok:
        raise SystemExit(1)
    _drain_at_sigterm()
    _read_templates_first()


def _read_templates_first() -> None:
    """Wrap the servicer flytekit's ``serve`` builds (:class:`_TemplatesFirst`), which parses a template before
    any connector is called and answers one it cannot parse (NaN in ``custom``) with its traceback."""
    from flytekit.clis.sdk_in_container import serve

    add = getattr(serve, "add_AsyncAgentServiceServicer_to_server", None)
    if add is None:
        logger.warning("this flytekit adds its servicer differently: a template it cannot read gets its traceback")
        return
    serve.add_AsyncAgentServiceServicer_to_server = lambda servicer, server: add(_TemplatesFirst(servicer), server)


class _TemplatesFirst:
    """flytekit's ``AsyncConnectorService``, but a ``CreateTask`` whose ``ddlscale_*`` template flytekit cannot
    read is answered as the connector answers a template it refuses: a refused metadata, FAILED at the first
    ``GetTask`` with the plugin's one line (:func:`~._services.connector_protocol.unreadable_template`)."""

    def __init__(self, servicer: Any) -> None:
        self._servicer = servicer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._servicer, name)

    async def CreateTask(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's method name
        task_type = request.template.type
        if task_type in TASK_TYPES:
            from ._services.connector_protocol import unreadable_template

            refused = unreadable_template(request.template)
            if refused is not None:
                from flyteidl.admin import agent_pb2

                from ._services.connector_calls import refusal
                from ._services.connector_meta import ScalingMetadata

                meta = ScalingMetadata.refused(task_type, refusal("create", refused))
                return agent_pb2.CreateTaskResponse(resource_meta=meta.encode())
        return await self._servicer.CreateTask(request, context)


def _drain_at_sigterm() -> None:
    """Put :func:`_health_and_drain` in place of flytekit's ``_start_health_check_server(server, worker)``: the
    one moment the server, its event loop and the health service meet, before ``serve`` starts the server."""
    from flytekit.clis.sdk_in_container import serve

    original = getattr(serve, "_start_health_check_server", None)
    if original is None or list(inspect.signature(original).parameters) != ["server", "worker"]:
        logger.warning("this flytekit starts its server differently: SIGTERM ends the connector without draining")
        return
    serve._start_health_check_server = _health_and_drain


def _health_and_drain(server: Any, worker: int) -> None:
    """What flytekit's ``_start_health_check_server`` does (every connector service and the server SERVING),
    and at SIGTERM: every status NOT_SERVING at once, then the server stopped with the calls in flight given
    :data:`SHUTDOWN_GRACE` seconds, after which flytekit's ``serve`` returns and the process exits 0."""
    try:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    except ImportError as error:
        print(f"Failed to start the health check servicer with error {error}", file=sys.stderr)
        return
    from flyteidl.service import agent_pb2

    class Health(health.HealthServicer):
        """grpc's health service, whose ``Watch`` streams end when the service drains: under grpc's asyncio
        server each holds a thread of the server's executor, which the interpreter waits for at exit."""

        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            self.watches: List[Any] = []

        def Watch(self, request: Any, context: Any, send_response_callback: Any = None) -> Any:  # noqa: N802
            watch = super().Watch(request, context, send_response_callback)
            if watch is not None:
                self.watches.append(watch)
            return watch

    servicer = Health(
        experimental_non_blocking=True, experimental_thread_pool=futures.ThreadPoolExecutor(max_workers=worker)
    )
    for service in agent_pb2.DESCRIPTOR.services_by_name.values():
        servicer.set(service.full_name, health_pb2.HealthCheckResponse.SERVING)
    servicer.set(health.SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)

    loop = asyncio.get_running_loop()
    stopping = []

    async def drain() -> None:
        servicer.enter_graceful_shutdown()
        for watch in servicer.watches:  # each has NOT_SERVING queued: sent, then the stream ends
            watch.close()
        print(f"ddlscale connector: SIGTERM: health NOT_SERVING; the calls in flight get up to {SHUTDOWN_GRACE:g} s",
              file=sys.stderr)
        await server.stop(SHUTDOWN_GRACE)

    def on_sigterm() -> None:
        if not stopping:  # a second SIGTERM does not shorten the grace
            stopping.append(loop.create_task(drain()))

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)


def register() -> None:
    """Put a :class:`DeferredConnector` for every task type in flytekit's registry, unless one serves it already."""
    for task_type in TASK_TYPES:
        try:
            ConnectorRegistry.get_connector(task_type)
        except FlyteConnectorNotFound:
            ConnectorRegistry.register(DeferredConnector(task_type))


register()
if serving():
    prepare_service()
