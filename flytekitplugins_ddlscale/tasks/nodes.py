"""The four scaling node types of flytekit flows, each its :class:`NodeKind` and a docstring, exported with
its configuration, outcome and task type. Constructors take the node's name, the configuration's fields
(in their order or by keyword), then flytekit's task options (``metadata``, ``requests``, ...).
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

    Inputs (defaults from the definition): ``cluster`` (``kind/name``, ``namespace/kind/name`` or a bare
    kind), ``replicas``, ``worker_hw_tier``, ``head_hw_tier``. ``wait=False`` returns once the request is
    accepted (pair it with ``WaitForCluster`` to pre-warm). With ``wait``, the node also waits until the
    workers registered with Dask/Ray/Spark where the run can reach the head (``framework_ready``,
    ``framework_url``; docs/readiness.md); the outcome's ``readiness`` says which checks proved it.
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

    Inputs: ``cluster``, ``replicas`` (``-1``, the default: the recorded baseline; with no baseline and no
    size the cluster is left as it is) and ``worker_hw_tier`` (only with a number). With ``wait``, it ends
    once the removed workers are gone and the framework has dropped them (as for ``ScaleCluster``).
    """

    kind = RESTORE
