"""Scaling nodes as Flyte 2 connector tasks: templates of the ``ddlscale_*`` task types that flyte's local
connector runner (``AsyncConnectorExecutorMixin``) runs through the registered connector, in-process."""
import dataclasses
from typing import Any, Dict, List, Optional

import flyte
from flyte import TaskTemplate
from flyte.connectors import AsyncConnectorExecutorMixin
from flyte.models import NativeInterface

import flytekitplugins_ddlscale.flyte2.connector  # noqa: F401 - registers the connectors
from flytekitplugins_ddlscale._services.nodes.config import RestoreConfig, ScaleConfig
from flytekitplugins_ddlscale._services.nodes.names import RESTORE_TASK_TYPE, SCALE_TASK_TYPE
from flytekitplugins_ddlscale._services.nodes.outputs import RestoreOutcome, ScaleOutcome

CLUSTER = "dask/flyte2-runner"


@dataclasses.dataclass(kw_only=True)
class ConnectorNode(AsyncConnectorExecutorMixin, TaskTemplate):
    """A node whose ``custom`` is its configuration; served by the connector of its task type."""

    settings: Optional[Any] = None

    def custom_config(self, sctx: Any) -> Dict[str, Any]:
        return self.settings.to_custom()


scale = ConnectorNode(
    name="runner_nodes.scale", task_type=SCALE_TASK_TYPE,
    interface=NativeInterface.from_types({"replicas": (int, 1)}, {"o0": ScaleOutcome}),
    settings=ScaleConfig(cluster=CLUSTER, replicas=1, timeout=60),
)
restore = ConnectorNode(
    name="runner_nodes.restore", task_type=RESTORE_TASK_TYPE,
    interface=NativeInterface.from_types({}, {"o0": RestoreOutcome}),
    settings=RestoreConfig(cluster=CLUSTER, replicas=0, timeout=60),
)
nodes = flyte.TaskEnvironment.from_task("runner_nodes", scale, restore)
env = flyte.TaskEnvironment("runner_flow", depends_on=[nodes])


@env.task
async def scale_and_restore(replicas: int) -> List[int]:
    """Scale through the connector, then restore: (workers ready after the scale, workers after the restore)."""
    up = await scale(replicas=replicas)
    back = await restore()
    return [up.ready_workers, back.workers]
