"""A Flyte connector for every scaling node: scale, wait, restore and head restart without a pod per node.

Where the deployment runs flytekit's connector service with this plugin
installed and routes the ``ddlscale_*`` task types to it, FlytePropeller calls
:meth:`ScalingConnector.create` once per node and then
:meth:`ScalingConnector.get` on its resync interval (30 s by default) until
the node ends. ``create`` checks the node and sends its change without
waiting: ``ScaleCluster`` the scale, ``RestoreCluster`` the restore,
``RestartHead`` the head restart, ``WaitForCluster`` nothing. It gives the
backend at most :data:`CREATE_TIMEOUT` seconds to accept the change, well
inside FlytePropeller's 10 s ``CreateTask`` timeout. Each ``get`` reads the
cluster once and decides: RUNNING, SUCCEEDED with the node's typed outcome,
or FAILED at the node's deadline, with what the change left in place and
the command that undoes it (:mod:`.inplace`), as the node itself would fail.
``get`` never sends a change, so a head restart is sent exactly once however
often it is called. Without a connector the same nodes run as ordinary
Python tasks in their container (the default, also for local runs).

This module is flytekit's side only (literals in, flytekit's ``Resource``
out); what the connector decides lives in
:class:`~flytekitplugins_ddlscale._services.connector_core.ScalingService`, which the
Flyte 2 connector (:mod:`.flyte2.connector`) shares.

Many executions at once: every ``get`` reads inside
:func:`~flytekitplugins_ddlscale._core.sharing.shared_reads`, so the connector
process answers all its executions' polls from one pod watch per namespace
on Kubernetes (kept :data:`SHARED_LINGER` seconds after the last read),
through backends kept open across polls (:data:`POLL_BACKENDS`), and
from shared, paced cluster polls on the scaler service (a read at most
:data:`SHARED_MAX_AGE` seconds old answers every execution on that
cluster). What a poll waits for stays in the resource metadata
(:mod:`.connector_meta`), so a restarted connector goes on where it was.

Framework readiness: the connector runs in the Flyte deployment, not in the
Domino run, so it finds the head as a node would from what the backend
reports for the cluster (:meth:`connection_env`: the variables Domino would
inject, e.g. the Dask-operator scheduler or KubeRay head service), after the
node's ``framework_url`` and the connector's own ``$DDLSCALE_<KIND>_URL`` /
``$DDLSCALE_FRAMEWORK_URL``, with one status read per ``get``. Where none
says where the head is, the outcome's ``readiness`` says the framework was
not checked.

What a template may ask for is the deployment's choice, not the template's:
the connector serves only the backends, namespaces and clusters its
environment lists (``scaler`` and ``kubernetes`` by default, never ``local``
unless listed) and reads a template's ``framework_url`` only on a head host
the backend reports for that cluster or the environment allows
(:mod:`.connector_policy`, docs/flyte.md). A failed framework read tells the
caller only that the endpoint is not ready; the detail goes to the debug log.
"""
import logging
from typing import Any, Optional

from flyteidl.core.execution_pb2 import TaskExecution
from flytekit.extend.backend.base_connector import AsyncConnectorBase, ConnectorRegistry, Resource
from flytekit.models.literals import LiteralMap
from flytekit.models.task import TaskTemplate

from ._services.connector_core import (
    FAILED,
    NOT_READY,
    POLL_BACKENDS,
    RUNNING,
    SERVED_TASK_TYPES,
    SHARED_LINGER,
    SHARED_MAX_AGE,
    SUCCEEDED,
    ScalingService,
    head_env,
)
from ._services.connector_inputs import node_inputs
from ._services.connector_meta import ScalingMetadata
from ._services.nodes.creating import CREATE_TIMEOUT
from ._services.connector_policy import ConnectorPolicy
from .errors import ScalingError
from ._services.nodes.names import OUTPUT_NAME

__all__ = [
    "CREATE_TIMEOUT", "NOT_READY", "POLL_BACKENDS", "SERVED_TASK_TYPES", "SHARED_LINGER", "SHARED_MAX_AGE",
    "ScalingConnector", "ScalingMetadata", "head_env", "register_connectors",
]

logger = logging.getLogger("flytekitplugins_ddlscale.connector")

PHASES = {RUNNING: TaskExecution.RUNNING, SUCCEEDED: TaskExecution.SUCCEEDED, FAILED: TaskExecution.FAILED}
"""A poll's answer as FlytePropeller's task execution phase."""


class ScalingConnector(AsyncConnectorBase):
    """Serves one ddlscale task type; register one instance per served type.

    What templates may ask for is fixed when the connector is built, from its
    environment (:class:`~flytekitplugins_ddlscale._services.connector_policy.ConnectorPolicy`).
    A refused or malformed template or resource metadata ends the node FAILED
    with a one-line message naming the field; nothing is sent for it.
    """

    name = "ddlscale connector"

    def __init__(self, task_type: str, policy: Optional[ConnectorPolicy] = None) -> None:
        if task_type not in SERVED_TASK_TYPES:
            raise ValueError(f"task_type must be one of {SERVED_TASK_TYPES}, not {task_type!r}")
        super().__init__(task_type_name=task_type, metadata_type=ScalingMetadata)
        self.service = ScalingService(policy)

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

        A typed error (bad input, a backend, namespace, cluster or head not
        served, an unknown tier...) comes back as a refused metadata whose
        ``get`` is FAILED with the error's message: flytekit's service would
        turn a raised error into gRPC INTERNAL with a traceback. A backend
        that is unreachable or does not accept a scale, wait or restore within
        :data:`CREATE_TIMEOUT` is raised (safe to repeat: FlytePropeller
        reports a retryable failure and the node's retries run it again).
        """
        task_type = task_template.type
        try:
            values = node_inputs(task_template, inputs)
        except ScalingError as error:
            logger.info("refused a %s template: %s", task_type, error)
            return ScalingMetadata.refused(task_type, error)
        return self.service.create(task_type, task_template.custom, values)

    def get(self, resource_meta: ScalingMetadata, **kwargs: Any) -> Resource:
        """One look at the cluster (:meth:`.ScalingService.poll`) as FlytePropeller's resource: RUNNING,
        SUCCEEDED with the node's typed outcome, or FAILED with a one-line message. Sends nothing."""
        answer = self.service.poll(resource_meta)
        if answer.state == SUCCEEDED:
            return Resource(phase=TaskExecution.SUCCEEDED, outputs={OUTPUT_NAME: answer.outcome})
        return Resource(phase=PHASES[answer.state], message=answer.message)

    def delete(self, resource_meta: ScalingMetadata, **kwargs: Any) -> None:
        """Aborting a node stops the wait only: the cluster keeps the size it was asked for, and a
        head restart already sent goes on.

        Pair pipelines with :func:`~flytekitplugins_ddlscale.workflow_helpers.scale_down_on_failure`
        to shrink after a failure or abort.
        """


def register_connectors() -> None:
    """Register a built connector for every served task type, in place of what serves it now.

    A deployment needs no call: flytekit's start-up registers the four task
    types (:mod:`.connector_entry`, the ``flytekit.plugins`` entry point) and
    the first call of each loads this module.
    """
    for task_type in SERVED_TASK_TYPES:
        ConnectorRegistry.register(ScalingConnector(task_type), override=True)
