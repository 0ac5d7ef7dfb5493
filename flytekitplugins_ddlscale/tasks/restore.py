"""``RestoreCluster``: a flow node that puts a cluster back to its recorded baseline (or a given size)."""
from typing import Any, Optional, Union

from ..backends.base import DEFAULT_SCALE_TIMEOUT
from .._services.nodes.config import FROM_BASELINE, RestoreConfig
from ..refs import ClusterRef
from .._services.nodes.kinds import RESTORE
from .base import ScalingTaskBase


class RestoreCluster(ScalingTaskBase[RestoreConfig]):
    """End a node-based flow cleanly; the output is a :class:`RestoreOutcome`.

    The first ``ScaleCluster`` that changes a cluster records its baseline;
    this node restores it without the flow having to know it (a local
    cluster the flow created is taken down) and forgets it:

    .. code-block:: python

        scale_up = ScaleCluster("scale_up", cluster="dask/train", replicas=4)
        restore = RestoreCluster("restore", cluster="dask/train")

        @workflow
        def wf():
            up = scale_up()
            out = train(workers=up.effective)
            out >> restore()

    Inputs: ``cluster: str``, ``replicas: int`` (``-1``, the default: the
    recorded baseline; a number: that size instead) and
    ``worker_hw_tier: Optional[str]`` (only with a number). With no baseline
    recorded and no size given, the cluster is left as it is. With ``wait``,
    it ends once the removed workers are gone and, unless ``framework_ready``
    is False, the framework (Dask scheduler, Ray head, Spark master; head found
    as for ``ScaleCluster``, or at ``framework_url``) has dropped them.
    """

    kind = RESTORE

    def __init__(
        self,
        name: str,
        cluster: Union[str, ClusterRef],
        replicas: int = FROM_BASELINE,
        worker_hw_tier: Optional[str] = None,
        wait: bool = True,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        backend: Optional[str] = None,
        framework_ready: bool = True,
        framework_url: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        config = RestoreConfig(
            cluster=cluster,  # type: ignore[arg-type]
            replicas=replicas,
            worker_hw_tier=worker_hw_tier,
            wait=wait,
            timeout=timeout,
            backend=backend,
            framework_ready=framework_ready,
            framework_url=framework_url,
        )
        super().__init__(name, config, **kwargs)
