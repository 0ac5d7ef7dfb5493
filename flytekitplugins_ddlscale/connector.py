"""flytekit's connector for every scaling node: scale, wait, restore and head restart without a pod per node.

flytekit's side only (input literals in, flytekit's ``Resource`` out): what the connector decides lives in
:class:`~._services.connector_core.ScalingService`, which the Flyte 2 connector shares (docs/connector.md).
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
    """Serves one ddlscale task type under the policy its environment sets when it is built
    (:class:`~._services.connector_policy.ConnectorPolicy`); register one instance per served type."""

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
        """Check the node (the per-project policy decides on ``task_execution_metadata``), send its change
        without waiting and return what ``get`` needs: a refused metadata, FAILED at its first ``get``, for a
        refused node; a head restart meeting an unavailable backend raises flytekit's user error."""
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
        """One look at the cluster as FlytePropeller's resource: RUNNING, SUCCEEDED with the node's typed
        outcome, or FAILED with one line; never raises. The read runs on the desk's threads, not the loop's."""
        answer = await self.desk.answer_async(resource_meta)
        return resource_of(answer, resource_meta.task_type, Resource, TaskExecution, TaskLog)

    def delete(self, resource_meta: ScalingMetadata, **kwargs: Any) -> None:
        """Aborting a node stops the wait only: the cluster keeps the size it was asked for, and a head
        restart already sent goes on (``scale_down_on_failure`` shrinks after a failure or abort)."""


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
    """Register a built connector for every served task type, in place of what serves it now (a deployment
    needs no call: :mod:`.connector_entry` registers the four at flytekit's start-up)."""
    for task_type in SERVED_TASK_TYPES:
        ConnectorRegistry.register(ScalingConnector(task_type), override=True)
