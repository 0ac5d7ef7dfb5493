"""The connection variables a run sees, set for a block and put back afterwards.

Domino injects ``DASK_SCHEDULER_SERVICE_HOST`` and the like into a run; a
backend that can say where a cluster's head is (the local one) offers them
through ``connection_env(ref)``, so code written for Domino runs unchanged.
"""
import contextlib
from typing import Dict, Iterator, Optional, Union

from .._core.lifetime import environ_set
from ..backends._base import ClusterBackend
from .opening import open_backend
from ..refs import ClusterRef, cluster_text, parse_cluster


def connection_variables(backend: ClusterBackend, ref: ClusterRef) -> Dict[str, str]:
    """The variables ``backend`` offers for ``ref`` (its ``connection_env``); empty when it offers none."""
    return dict(backend.connection_env(ref))


@contextlib.contextmanager
def connected(cluster: Union[str, ClusterRef], backend: Optional[str] = None) -> Iterator[Dict[str, str]]:
    """Make the cluster's connection variables (``DASK_SCHEDULER_SERVICE_HOST``...) present in the block.

    In a Domino run they are injected already and are left alone. Elsewhere,
    a backend that offers ``connection_env(ref)`` (the local backend) sets
    them for the block; previous values come back on exit. Yields the
    variables set (empty when nothing was set).
    """
    ref = parse_cluster(cluster_text(cluster))
    with open_backend(backend) as chosen:
        values = connection_variables(chosen, ref)
    with environ_set(values) as present:
        yield present
