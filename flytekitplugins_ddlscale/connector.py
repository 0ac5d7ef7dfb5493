"""A Flyte connector for every scaling node: scale, wait, restore and head restart without a pod per node.

Where the deployment runs flytekit's connector service with this plugin
installed and routes the ``ddlscale_*`` task types to it, FlytePropeller calls
:meth:`ScalingConnector.create` once per node and then
:meth:`ScalingConnector.get` on its resync interval (30 s by default) until
the node ends. ``create`` checks the node and sends its change without
waiting, within :data:`CREATE_TIMEOUT` seconds (well inside FlytePropeller's
10 s ``CreateTask`` timeout); each ``get`` reads the cluster once and answers
RUNNING, SUCCEEDED with the node's typed outcome, or FAILED at the node's
deadline, as the node itself would fail. Without a connector the same nodes
run as ordinary Python tasks in their container (the default, also for local runs).

A ``get`` whose backend does not answer within the call budget
(``$DDLSCALE_CONNECTOR_CALL_BUDGET``, 7 s) is RUNNING with the last state
known, and no answer carries a traceback (:mod:`._services.connector_calls`):
FlytePropeller counts a failed or late ``GetTask`` and gives a node up after
a few, whatever its own timeout.

This module is flytekit's side only (literals in, flytekit's ``Resource``
out); what the connector decides (which change each node type sends, a change
the backend could not take at ``create`` sent again by ``get``, a head restart
sent exactly once) lives in
:class:`~flytekitplugins_ddlscale._services.connector_core.ScalingService`, which the
Flyte 2 connector (:mod:`.flyte2.connector`) shares.

Many executions at once: every ``get`` reads with :data:`SHARED_READS`, so the
connector process answers all its executions' polls from one pod watch per
namespace on Kubernetes (kept ``linger`` seconds after the last read), through
backends kept open across polls (:data:`POLL_BACKENDS`), and from shared, paced
cluster polls on the scaler service (a read at most ``max_age`` seconds old
answers every execution on that cluster); a poll those hold the answer to is
answered on the event loop itself. What a poll waits for stays in the resource metadata
(:mod:`.connector_meta`), so a restarted connector goes on where it was.

Framework readiness: the connector runs in the Flyte deployment, not in the
Domino run, so it finds the head as a node would from what the backend
reports for the cluster (:meth:`connection_env`: the variables Domino would
inject, e.g. the Dask-operator scheduler or KubeRay head service), after the
node's ``framework_url`` and the connector's own ``$DDLSCALE_<KIND>_URL`` /
``$DDLSCALE_FRAMEWORK_URL``, with one status read per ``get``. Where none
says where the head is, the outcome's ``readiness`` says the framework was
not checked.

What a template may ask for is the deployment's choice, not the template's
(:mod:`._services.connector_policy`, docs/flyte.md).
"""
from typing import Any, Optional

from flyteidl.core.execution_pb2 import TaskExecution, TaskLog
from flytekit.exceptions.user import FlyteUserRuntimeException
from flytekit.extend.backend.base_connector import AsyncConnectorBase, ConnectorRegistry, Resource
from flytekit.models.literals import LiteralMap
from flytekit.models.task import TaskTemplate

from ._services.connector_core import (
    FAILED,
    NOT_READY,
    POLL_BACKENDS,
    RUNNING,
    SERVED_TASK_TYPES,
    SHARED_READS,
    SUCCEEDED,
    Poll,
    ScalingService,
    head_env,
)
from ._services.connector_calls import PollDesk, refusal, refused_create
from ._services.connector_inputs import node_inputs
from ._services.connector_meta import ScalingMetadata
from ._services.nodes.kinds import CREATE_TIMEOUT
from ._services.connector_policy import ConnectorPolicy, Execution
from ._services.nodes.names import OUTPUT_NAME
from ._services.nodes import NODE_KINDS

__all__ = [
    "CREATE_TIMEOUT", "NOT_READY", "POLL_BACKENDS", "SERVED_TASK_TYPES", "SHARED_READS",
    "ScalingConnector", "ScalingMetadata", "head_env", "register_connectors",
]

PHASES = {RUNNING: TaskExecution.RUNNING, SUCCEEDED: TaskExecution.SUCCEEDED, FAILED: TaskExecution.FAILED}
"""A poll's answer as FlytePropeller's task execution phase."""


class ScalingConnector(AsyncConnectorBase):
    """Serves one ddlscale task type; register one instance per served type.

    What templates may ask for is fixed when the connector is built, from its
    environment (:class:`~flytekitplugins_ddlscale._services.connector_policy.ConnectorPolicy`).
    A refused or malformed template, or a malformed resource metadata, ends
    the node FAILED at its first ``get`` with a one-line message naming the
    field; nothing is sent for either, and no answer carries a traceback
    (:mod:`.connector_calls`).
    """

    name = "ddlscale connector"

    def __init__(self, task_type: str, policy: Optional[ConnectorPolicy] = None) -> None:
        if task_type not in SERVED_TASK_TYPES:
            raise ValueError(f"task_type must be one of {SERVED_TASK_TYPES}, not {task_type!r}")
        super().__init__(task_type_name=task_type, metadata_type=ScalingMetadata)
        self.service = ScalingService(policy)
        self.desk = PollDesk(self.service)

    @property
    def policy(self) -> ConnectorPolicy:
        """What templates may ask for (the deployment's choice)."""
        return self.service.policy

    def create(
        self,
        task_template: TaskTemplate,
        output_prefix: str = "",
        inputs: Optional[LiteralMap] = None,
        task_execution_metadata: Any = None,
        **kwargs: Any,
    ) -> ScalingMetadata:
        """Check the node, send its change (without waiting) and return what ``get`` needs.

        A refused node (bad input, a backend, namespace, cluster or head not
        served, an unknown tier, anything unexpected...) sends nothing and
        returns a refused metadata: the first ``get`` is FAILED with its
        one-line message, which FlytePropeller does not retry (it retries
        every failed CreateTask, and each retry would be refused alike). A
        backend that is unreachable or does not accept a scale, wait or
        restore within :data:`CREATE_TIMEOUT` does not fail it: the change is
        left to ``get`` (safe to repeat); a head restart meeting one before
        it is sent fails here (nothing sent), so that Flyte's ``retries`` send
        it again. flytekit's service answers a raised error with the
        exception's traceback, so that error is handed over as flytekit's own
        user-error wrapper around an error that carries no traceback: the
        answer names the error class and its message only. The execution
        FlytePropeller describes (``task_execution_metadata``) is what the
        per-project policy decides on.
        """
        try:
            values = node_inputs(task_template, inputs)
            execution = Execution.of(task_execution_metadata)
            return self.service.create(task_template.type, task_template.custom, values, execution)
        except Exception as error:
            failure = refusal("create", error)
        refused = refused_create(self.task_category.name, failure)
        if refused is not None:
            return refused
        raise FlyteUserRuntimeException(failure) from failure

    async def get(self, resource_meta: ScalingMetadata, **kwargs: Any) -> Resource:
        """One look at the cluster (:meth:`.ScalingService.poll`) as FlytePropeller's resource: RUNNING,
        SUCCEEDED with the node's typed outcome, or FAILED with a one-line message; RUNNING with the
        last state known when the backend does not answer within the call budget
        (:class:`~._services.connector_calls.PollDesk`). Log links and custom info say what the Flyte UI
        shows. Sends nothing but a scale, wait or restore its ``create`` could not send (the backend
        unavailable) and never raises.

        A coroutine, which flytekit's service awaits on its event loop: the read runs on the desk's own
        threads and no thread waits for it, so polls of a hung backend cannot hold every thread of the
        loop's executor (a handful) and leave the other executions' polls queued past FlytePropeller's
        10 s deadline. Outside a loop: ``asyncio.run(connector.get(meta))``."""
        return resource_of(await self.desk.answer_async(resource_meta), resource_meta.task_type)

    def delete(self, resource_meta: ScalingMetadata, **kwargs: Any) -> None:
        """Aborting a node stops the wait only: the cluster keeps the size it was asked for, and a
        head restart already sent goes on.

        Pair pipelines with :func:`~flytekitplugins_ddlscale.workflow_helpers.scale_down_on_failure`
        to shrink after a failure or abort.
        """


def resource_of(answer: Poll, task_type: str = "") -> Resource:
    """A poll's answer as flytekit's resource: the phase, the message (once SUCCEEDED the node's summary
    line), the typed outcome as output ``o0`` once SUCCEEDED, the dashboard links, and the counts with
    ``summary``, the message, in ``custom_info``: FlytePropeller drops the message of a RUNNING or
    SUCCEEDED answer and sends custom info with each phase's first answer (docs/connector.md)."""
    message = answer.message
    if answer.state == SUCCEEDED and task_type in NODE_KINDS and answer.outcome is not None:
        kind = NODE_KINDS[task_type]
        message = kind.summary(kind.node, answer.outcome, None)
    info = dict(answer.info, summary=message) if message else dict(answer.info)
    return Resource(
        phase=PHASES[answer.state],
        message=message,
        outputs={OUTPUT_NAME: answer.outcome} if answer.state == SUCCEEDED else None,
        log_links=[TaskLog(name=name, uri=uri) for name, uri in answer.links] or None,
        custom_info=info or None,
    )


def register_connectors() -> None:
    """Register a built connector for every served task type, in place of what serves it now.

    A deployment needs no call: flytekit's start-up registers the four task
    types (:mod:`.connector_entry`, the ``flytekit.plugins`` entry point) and
    the first call of each loads this module.
    """
    for task_type in SERVED_TASK_TYPES:
        ConnectorRegistry.register(ScalingConnector(task_type), override=True)
