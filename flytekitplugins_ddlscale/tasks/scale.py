"""``ScaleCluster``: a flow node that sets a cluster's worker count and tier."""
from typing import Any, Optional, Union

from ..backends.base import DEFAULT_SCALE_TIMEOUT
from .._services.nodes.config import ScaleConfig
from ..refs import ClusterRef
from .._services.nodes.kinds import SCALE
from .base import ScalingTaskBase


class ScaleCluster(ScalingTaskBase[ScaleConfig]):
    """Scale a cluster as a step of a flow; the output is a :class:`ScaleOutcome`.

    .. code-block:: python

        scale_up = ScaleCluster("scale_up", cluster="dask/train", replicas=4)
        scale_down = ScaleCluster("scale_down", cluster="dask/train", replicas=0)

        @workflow
        def wf():
            up = scale_up()               # or scale_up(replicas=n) at run time
            out = train(workers=up.effective)
            up >> out >> scale_down()

    Inputs (defaults from the definition): ``cluster: str`` (``kind/name``,
    ``namespace/kind/name`` or a bare kind for the run's own cluster),
    ``replicas: int``, ``worker_hw_tier: Optional[str]``,
    ``head_hw_tier: Optional[str]``. ``wait=False`` returns as soon as the
    request is accepted; pair it with ``WaitForCluster`` to pre-warm.
    With ``wait``, the node also waits until the workers registered with
    Dask/Ray/Spark where the run can reach the cluster's head
    (``framework_ready=False`` switches that off; ``framework_url`` says
    where the head's dashboard is; see docs/readiness.md), and the
    outcome's ``readiness`` says which checks proved it.
    """

    kind = SCALE

    def __init__(
        self,
        name: str,
        cluster: Union[str, ClusterRef],
        replicas: int,
        worker_hw_tier: Optional[str] = None,
        head_hw_tier: Optional[str] = None,
        wait: bool = True,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        strict: bool = False,
        backend: Optional[str] = None,
        framework_ready: bool = True,
        framework_url: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        config = ScaleConfig(
            cluster=cluster,  # type: ignore[arg-type]
            replicas=replicas,
            worker_hw_tier=worker_hw_tier,
            head_hw_tier=head_hw_tier,
            wait=wait,
            timeout=timeout,
            strict=strict,
            backend=backend,
            framework_ready=framework_ready,
            framework_url=framework_url,
        )
        super().__init__(name, config, **kwargs)
