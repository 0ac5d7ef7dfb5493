"""The connection variables a run sees (``DASK_SCHEDULER_SERVICE_HOST`` ...), set for a block: Domino injects
them into a run; a backend that knows where a cluster's head is (the local one) offers them through
``connection_env(ref)``, so code written for Domino runs unchanged.
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
    """The cluster's connection variables present in the block, previous values back on exit; yields those
    set (none in a Domino run, which has them already, or for a backend that offers none)."""
    ref = parse_cluster(cluster_text(cluster))
    with open_backend(backend) as chosen:
        values = connection_variables(chosen, ref)
    with environ_set(values) as present:
        yield present
