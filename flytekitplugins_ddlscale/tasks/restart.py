"""``RestartHead``: a flow node that replaces a cluster's head pod, optionally on a new tier."""
import time
from typing import Any, Optional, Union

from ..backends.base import DEFAULT_RESTART_TIMEOUT
from .._services.nodes.config import RestartConfig
from .._services.nodes.names import RESTART_TASK_TYPE
from .._services.nodes.outputs import RestartOutcome
from .._core.progress import emit_summary
from ..refs import ClusterRef
from .._core.summary import restart_line
from .base import ScalingTaskBase
from .._services.nodes.run import run_restart


class RestartHead(ScalingTaskBase[RestartConfig]):
    """Restart a cluster's head as a step of a flow; the output is a :class:`RestartOutcome`.

    Inputs (defaults from the definition): ``cluster: str`` and
    ``head_hw_tier: Optional[str]`` (a tier change needs a backend whose
    ``capabilities.head_tier`` is True, e.g. kubernetes).
    """

    def __init__(
        self,
        name: str,
        cluster: Union[str, ClusterRef],
        head_hw_tier: Optional[str] = None,
        wait: bool = True,
        timeout: float = DEFAULT_RESTART_TIMEOUT,
        backend: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        config = RestartConfig(
            cluster=cluster,  # type: ignore[arg-type]
            head_hw_tier=head_hw_tier,
            wait=wait,
            timeout=timeout,
            backend=backend,
        )
        super().__init__(
            name=name,
            task_config=config,
            task_type=RESTART_TASK_TYPE,
            inputs={
                "cluster": (str, config.cluster),
                "head_hw_tier": (Optional[str], config.head_hw_tier),
            },
            output_type=RestartOutcome,
            **kwargs,
        )

    def execute(self, **kwargs: Any) -> RestartOutcome:
        """Restart with the node's inputs; publish the Deck; print the summary line; return the outcome."""
        started = time.monotonic()
        cluster = kwargs.get("cluster", self.task_config.cluster)
        with self.reporter(cluster, goal="waiting for the new head") as progress:
            outcome, timeline = run_restart(
                self.task_config,
                cluster=cluster,
                head_hw_tier=kwargs.get("head_hw_tier", self.task_config.head_hw_tier),
                progress=progress,
            )
        self.publish("Head restart", timeline, outcome)
        emit_summary(restart_line(self.short_name, outcome, time.monotonic() - started))
        return outcome
