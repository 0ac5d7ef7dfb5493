"""The Flyte 2 surface: scaling nodes as ``flyte`` 2 tasks, ``distributed_phase`` for ``@env.task`` functions.

.. code-block:: python

    env = flyte.TaskEnvironment("train")
    prewarm = ScaleCluster("prewarm", env=env, cluster="dask/train", replicas=2, wait=False)

    @env.task(report=True)
    @distributed_phase(cluster="dask/train", replicas=2)
    async def train() -> int: ...

Needs the ``flyte2`` extra (the ``flyte`` SDK), imported when a node or phase is defined, not with the package.
"""
from .._services.opening import connected
from .._services.nodes.kinds import UNKNOWN
from .._services.nodes.restore import FROM_BASELINE
from .._services.nodes.wait import ANY_DESIRED
from . import nodes
from .nodes import *  # noqa: F401,F403 - every node type with its outcome
from .phase import distributed_phase

__all__ = ["ANY_DESIRED", "FROM_BASELINE", "UNKNOWN", "connected", "distributed_phase", *nodes.__all__]
