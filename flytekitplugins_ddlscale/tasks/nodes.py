"""The four scaling node types of flytekit flows: each is its :class:`NodeKind` and a docstring.

Their constructors take the node's name, then the fields of its
configuration (in the node type's module under ``_services/nodes/``:
positionally in their order or by keyword), then flytekit's task options
(``metadata``, ``requests``, ``environment`` ...). Each node type's
configuration, outcome and task type are exported with it.
"""
from .._services.nodes.restart import RESTART, RESTART_TASK_TYPE, RestartConfig, RestartOutcome
from .._services.nodes.restore import RESTORE, RESTORE_TASK_TYPE, RestoreConfig, RestoreOutcome
from .._services.nodes.scale import SCALE, SCALE_TASK_TYPE, ScaleConfig, ScaleOutcome
from .._services.nodes.wait import WAIT, WAIT_TASK_TYPE, ClusterReady, WaitConfig
from .base import ScalingTaskBase

__all__ = [
    "ScaleCluster", "ScaleConfig", "ScaleOutcome", "SCALE_TASK_TYPE",
    "WaitForCluster", "WaitConfig", "ClusterReady", "WAIT_TASK_TYPE",
    "RestartHead", "RestartConfig", "RestartOutcome", "RESTART_TASK_TYPE",
    "RestoreCluster", "RestoreConfig", "RestoreOutcome", "RESTORE_TASK_TYPE",
]


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


class RestartHead(ScalingTaskBase[RestartConfig]):
    """Restart a cluster's head as a step of a flow; the output is a :class:`RestartOutcome`.

    Inputs (defaults from the definition): ``cluster: str`` and
    ``head_hw_tier: Optional[str]`` (a tier change needs a backend whose
    ``capabilities.head_tier`` is True, e.g. kubernetes).
    """

    kind = RESTART


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
