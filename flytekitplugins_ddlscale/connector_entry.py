"""flytekit's entry point (``flytekit.plugins``): the four ``ddlscale_*`` connectors in flytekit's registry.

flytekit imports every ``flytekit.plugins`` entry point when it is itself
imported, in every process (a task pod, ``pyflyte run``, a notebook), and
its connector service (``pyflyte serve connector``) serves what flytekit's
``ConnectorRegistry`` holds by then. flytekit's own connector plugins
register there when their package is imported; so does this module, so a
stock ``pyflyte serve connector`` (no ``--modules``, as the Flyte connector
chart starts it) serves ``ddlscale_scale``, ``ddlscale_wait``,
``ddlscale_restore`` and ``ddlscale_restart_head``.

What it registers costs nothing to build: a :class:`DeferredConnector` per
task type, which imports the connector (:mod:`flytekitplugins_ddlscale.connector`,
its services and backends, about 90 ms) on its first call from the service
(``CreateTask``, ``GetTask``, ``DeleteTask``) and hands every call to it.
``ListAgents`` answers from the registry alone. A process that never serves
a connector pays for this module and the task type names only
(benchmarks/bench_import.py). The connector is named by its module path, as
the package root names every surface, so that loading it stays a decision
taken at the first call.
"""
import asyncio
import importlib
import threading
from typing import Any, Optional

from flytekit.exceptions.system import FlyteConnectorNotFound
from flytekit.extend.backend.base_connector import AsyncConnectorBase, ConnectorRegistry, Resource, ResourceMeta

from ._services.nodes.names import TASK_TYPE_NAMES

__all__ = ["CONNECTOR_MODULE", "CONNECTOR_NAME", "DeferredConnector", "register"]

CONNECTOR_MODULE = "flytekitplugins_ddlscale.connector"
"""The module whose ``ScalingConnector`` answers the calls."""
CONNECTOR_NAME = "ddlscale connector"
"""The name ``ListAgents`` gives the four task types (``ScalingConnector.name``)."""


class DeferredConnector(AsyncConnectorBase):
    """Stands in flytekit's registry for one ``ddlscale_*`` task type; the first call loads the connector.

    Every call goes to one ``ScalingConnector`` of the same task type, built
    once (under a lock: the service calls from a thread pool) from the
    service's environment at that moment.
    """

    name = CONNECTOR_NAME

    def __init__(self, task_type: str) -> None:
        if task_type not in TASK_TYPE_NAMES:
            raise ValueError(f"task_type must be one of {TASK_TYPE_NAMES}, not {task_type!r}")
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


def register() -> None:
    """Put a :class:`DeferredConnector` for every task type in flytekit's registry, unless one serves it already."""
    for task_type in TASK_TYPE_NAMES:
        try:
            ConnectorRegistry.get_connector(task_type)
        except FlyteConnectorNotFound:
            ConnectorRegistry.register(DeferredConnector(task_type))


register()
