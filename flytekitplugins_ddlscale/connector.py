"""flytekit's connector for every scaling node: scale, wait, restore and head restart without a pod per node.

Where the deployment routes the ``ddlscale_*`` task types to flytekit's connector service with this plugin
installed, FlytePropeller calls :meth:`ScalingConnector.create` once per node, which checks the node and sends
its change within :data:`CREATE_TIMEOUT` seconds, then :meth:`ScalingConnector.get` on its resync interval
until the node ends: each ``get`` reads the cluster once (within the call budget, from reads shared by every
execution, :data:`SHARED_READS`) and answers RUNNING, SUCCEEDED with the node's typed outcome, or FAILED, as
the node itself would. Without a connector the same nodes run in their container.

This module is flytekit's side only (input literals in, flytekit's ``Resource`` out); what the connector
decides lives in :class:`~._services.connector_core.ScalingService`, which the Flyte 2 connector shares, and
what templates may ask for is the deployment's choice (:mod:`._services.connector_policy`, docs/connector.md).
"""
from typing import Any, Dict, Optional

from flyteidl.core.execution_pb2 import TaskExecution, TaskLog
from flytekit import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.exceptions.user import FlyteUserRuntimeException
from flytekit.extend.backend.base_connector import AsyncConnectorBase, ConnectorRegistry, Resource
from flytekit.models.literals import LiteralMap
from flytekit.models.task import TaskTemplate

from ._services.connector_core import NOT_READY, POLL_BACKENDS, SERVED_TASK_TYPES, SHARED_READS, ScalingService, head_env
from ._services.connector_calls import PollDesk, refusal, refused_create
from ._services.connector_protocol import resource_of
from ._services.connector_meta import ScalingMetadata
from ._services.nodes.kinds import CREATE_TIMEOUT
from ._services.connector_policy import ConnectorPolicy, Execution
from .errors import InvalidInputError

__all__ = [
    "CREATE_TIMEOUT", "NOT_READY", "POLL_BACKENDS", "SERVED_TASK_TYPES", "SHARED_READS",
    "ScalingConnector", "ScalingMetadata", "head_env", "register_connectors",
]

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
        answer = await self.desk.answer_async(resource_meta)
        return resource_of(answer, resource_meta.task_type, Resource, TaskExecution, TaskLog)

    def delete(self, resource_meta: ScalingMetadata, **kwargs: Any) -> None:
        """Aborting a node stops the wait only: the cluster keeps the size it was asked for, and a
        head restart already sent goes on.

        Pair pipelines with :func:`~flytekitplugins_ddlscale.workflow_helpers.scale_down_on_failure`
        to shrink after a failure or abort.
        """


def node_inputs(template: TaskTemplate, inputs: Optional[LiteralMap]) -> Dict[str, Any]:
    """The Python values of ``inputs``, each converted to the type the template's interface declares for it.
    They come from whoever registered the workflow: anything unreadable is :class:`InvalidInputError` naming
    the field (``inputs.<name>``), never a flytekit traceback."""
    if inputs is None or not inputs.literals:
        return {}
    declared = template.interface.inputs if template.interface is not None else {}
    ctx = FlyteContextManager.current_context()
    values = {}
    for name, literal in inputs.literals.items():
        if name not in declared:
            raise InvalidInputError(f"inputs.{name}", "<literal>", f"one of the node's inputs: {', '.join(declared) or 'none'}")
        python_type: Any = None
        try:
            python_type = TypeEngine.guess_python_type(declared[name].type)
            values[name] = TypeEngine.to_python_value(ctx, literal, python_type)
        except Exception as error:  # flytekit raises many types for a literal of the wrong kind
            raise InvalidInputError(
                f"inputs.{name}", _short(literal), f"a value of type {_type_name(python_type)}, as the node's interface declares",
                reason=f"not convertible ({type(error).__name__})",
            ) from None
    return values


def _type_name(python_type: Any) -> str:
    if python_type is None:
        return "readable"
    return getattr(python_type, "__name__", None) or str(python_type).replace("typing.", "")


def _short(literal: Any) -> str:
    """The literal's value in one short line: its primitive value where it has one."""
    scalar = getattr(literal, "scalar", None)
    primitive = getattr(scalar, "primitive", None) if scalar is not None else None
    value = getattr(primitive, "value", None) if primitive is not None else None
    text = " ".join(str(value if value is not None else "<literal>").split())
    return text if len(text) <= 80 else text[:77] + "..."


def register_connectors() -> None:
    """Register a built connector for every served task type, in place of what serves it now.

    A deployment needs no call: flytekit's start-up registers the four task
    types (:mod:`.connector_entry`, the ``flytekit.plugins`` entry point) and
    the first call of each loads this module.
    """
    for task_type in SERVED_TASK_TYPES:
        ConnectorRegistry.register(ScalingConnector(task_type), override=True)
