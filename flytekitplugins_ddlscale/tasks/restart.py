"""``RestartHead``: a flow node that replaces a cluster's head pod, optionally on a new tier."""
from typing import Any, Optional, Union

from ..backends.base import DEFAULT_RESTART_TIMEOUT
from .._services.nodes.config import RestartConfig
from ..refs import ClusterRef
from .._services.nodes.kinds import RESTART
from .base import ScalingTaskBase


class RestartHead(ScalingTaskBase[RestartConfig]):
    """Restart a cluster's head as a step of a flow; the output is a :class:`RestartOutcome`.

    Inputs (defaults from the definition): ``cluster: str`` and
    ``head_hw_tier: Optional[str]`` (a tier change needs a backend whose
    ``capabilities.head_tier`` is True, e.g. kubernetes).
    """

    kind = RESTART

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
        super().__init__(name, config, **kwargs)
