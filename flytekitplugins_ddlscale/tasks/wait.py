"""``WaitForCluster``: a flow node that waits for workers a ``ScaleCluster(wait=False)`` requested."""
import time
from typing import Any, Optional, Union

from ..backends.base import DEFAULT_SCALE_TIMEOUT
from .._services.nodes.config import ANY_DESIRED, WaitConfig
from .._services.nodes.names import WAIT_TASK_TYPE
from .._services.nodes.outputs import ClusterReady
from .._core.progress import emit_summary
from ..refs import ClusterRef
from .._core.summary import wait_line
from .base import ScalingTaskBase
from .._services.nodes.run import run_wait


class WaitForCluster(ScalingTaskBase[WaitConfig]):
    """Wait until a cluster's workers are up; the output is a :class:`ClusterReady`.

    Pre-warming: request the scale without waiting, run a single-node stage
    meanwhile, and wait only right before the distributed stage:

    .. code-block:: python

        request = ScaleCluster("request", cluster="dask/train", replicas=4, wait=False)
        ready = WaitForCluster("ready", cluster="dask/train")

        @workflow
        def wf():
            pending = request()
            data = prepare()
            up = ready(replicas=pending.effective)
            data >> up
            train(data=data, workers=up.workers)

    Inputs: ``cluster: str`` and ``replicas: int`` (``-1``, the default,
    waits for whatever ``spec.worker.replicas`` asks for). Framework
    readiness (``framework_ready``, ``framework_url``) as for ``ScaleCluster``.
    """

    def __init__(
        self,
        name: str,
        cluster: Union[str, ClusterRef],
        replicas: int = ANY_DESIRED,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        backend: Optional[str] = None,
        framework_ready: bool = True,
        framework_url: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        config = WaitConfig(
            cluster=cluster,  # type: ignore[arg-type]
            replicas=replicas,
            timeout=timeout,
            backend=backend,
            framework_ready=framework_ready,
            framework_url=framework_url,
        )
        super().__init__(
            name=name,
            task_config=config,
            task_type=WAIT_TASK_TYPE,
            inputs={"cluster": (str, config.cluster), "replicas": (int, config.replicas)},
            output_type=ClusterReady,
            **kwargs,
        )

    def execute(self, **kwargs: Any) -> ClusterReady:
        """Wait with the node's inputs; publish the Deck; print the summary line; return what was seen."""
        started = time.monotonic()
        cluster = kwargs.get("cluster", self.task_config.cluster)
        with self.reporter(cluster) as progress:
            outcome, timeline = run_wait(
                self.task_config,
                cluster=cluster,
                replicas=kwargs.get("replicas", self.task_config.replicas),
                progress=progress,
            )
        self.publish("Cluster wait", timeline, outcome)
        emit_summary(wait_line(self.short_name, outcome, time.monotonic() - started))
        return outcome
