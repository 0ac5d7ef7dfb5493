"""``WaitForCluster``: a flow node that waits for workers a ``ScaleCluster(wait=False)`` requested."""
from typing import Any, Optional, Union

from ..backends.base import DEFAULT_SCALE_TIMEOUT
from .._services.nodes.config import ANY_DESIRED, WaitConfig
from ..refs import ClusterRef
from .._services.nodes.kinds import WAIT
from .base import ScalingTaskBase


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

    kind = WAIT

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
        super().__init__(name, config, **kwargs)
