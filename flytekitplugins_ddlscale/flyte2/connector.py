"""Flyte 2's connector for every scaling node, on the :class:`~.._services.connector_core.ScalingService`
flytekit's connector uses. flyte's connector server gets the deployment's policy; a ``mode="local"`` run,
which calls in the user's own process with the user's credentials, gets :func:`in_process_policy`.
Registered on import (the ``flyte.connectors`` entry point).
"""
import asyncio
import os
import sys
from typing import Any, Dict, Optional

from flyte.connectors import AsyncConnector, ConnectorRegistry, Resource
from flyteidl2.core.execution_pb2 import TaskExecution, TaskLog

from .._services.connector_calls import PollDesk, refusal, refused_create
from .._services.connector_core import SERVED_TASK_TYPES, ScalingService
from .._services.connector_meta import ScalingMetadata
from .._services.connector_protocol import resource_of, struct_values
from ..backends import available_backends
from .._services.connector_policy import ConnectorPolicy, Execution, start_lines

class ScalingConnector(AsyncConnector[ScalingMetadata]):
    """Serves one ddlscale task type for Flyte 2 under its environment's policy, or :func:`in_process_policy`
    for calls from flyte's local runner in this process (:func:`in_local_run`)."""

    name = "ddlscale connector"
    metadata_type = ScalingMetadata

    def __init__(self, task_type: str, policy: Optional[ConnectorPolicy] = None) -> None:
        if task_type not in SERVED_TASK_TYPES:
            raise ValueError(f"task_type must be one of {SERVED_TASK_TYPES}, not {task_type!r}")
        self.task_type_name = task_type
        self.service = ScalingService(policy)
        self._desk = PollDesk(self.service)
        self._in_process: Optional[ScalingService] = None
        self._in_process_desk: Optional[PollDesk] = None

    def serving(self) -> ScalingService:
        """The service for the current call: the in-process one inside a local run's task, else the deployment's."""
        if not in_local_run():
            return self.service
        if self._in_process is None:
            self._in_process = ScalingService(in_process_policy())
            self._in_process_desk = PollDesk(self._in_process)
        return self._in_process

    def desk(self) -> PollDesk:
        """Where the current call's polls are answered within the call budget (:meth:`serving`'s service)."""
        service = self.serving()
        return self._desk if service is self.service or self._in_process_desk is None else self._in_process_desk

    async def create(
        self,
        task_template: Any,
        output_prefix: str = "",
        inputs: Optional[Dict[str, Any]] = None,
        task_execution_metadata: Any = None,
        **kwargs: Any,
    ) -> ScalingMetadata:
        """Check the node, send its change without waiting and return what ``get`` needs, as flytekit's
        connector does (a refused node: a refused metadata, FAILED at the first ``get``)."""
        try:
            custom = struct_values(task_template.custom) if task_template.HasField("custom") else None
            execution = Execution.of(task_execution_metadata)
            return await asyncio.to_thread(self.serving().create, task_template.type, custom, inputs or {}, execution)
        except Exception as error:
            failure = refusal("create", error)
        refused = refused_create(self.task_type_name, failure)
        if refused is not None:
            return refused
        raise failure

    async def get(self, resource_meta: ScalingMetadata, **kwargs: Any) -> Resource:
        """One look at the cluster: RUNNING, SUCCEEDED with the typed outcome (output ``o0``), or FAILED
        with a one-line message, as flytekit's connector answers; never raises."""
        answer = await self.desk().answer_async(resource_meta)
        return resource_of(answer, resource_meta.task_type, Resource, TaskExecution, TaskLog)

    async def delete(self, resource_meta: ScalingMetadata, **kwargs: Any) -> None:
        """Aborting a node stops the wait only: the cluster keeps the size it was asked for, and a head
        restart already sent goes on (as for flytekit's connector); a parent restores with ``RestoreCluster``."""


def in_local_run() -> bool:
    """Whether this call comes from a task of a ``mode="local"`` flyte run in this process (flyte's local
    runner calls inside the node's task context; its connector server runs no task)."""
    import flyte

    context = flyte.ctx()
    return bool(context) and context.mode == "local"


def in_process_policy() -> ConnectorPolicy:
    """What a local run's nodes may ask for: every installed backend, any namespace, cluster and head host."""
    return ConnectorPolicy(backends=tuple(sorted(available_backends())), framework_hosts=("*",))


def check_served_at_start() -> None:
    """In flyte's connector server ``c0``: say what it serves, or stop it with one line (a bad policy or
    setting), since ``c0`` only warns about a connector that fails to load and serves on without it."""
    if os.path.basename(sys.argv[0]) != "c0":
        return
    ok, lines = start_lines()
    print(*lines, sep="\n", file=sys.stderr, flush=True)
    if not ok:
        os._exit(1)  # c0 loads connectors inside its event loop, which does not end on SystemExit


def register_connectors() -> None:
    """Register a connector for every served task type in flyte's registry (idempotent)."""
    for task_type in SERVED_TASK_TYPES:
        ConnectorRegistry.register(ScalingConnector(task_type), override=True)


check_served_at_start()
register_connectors()
