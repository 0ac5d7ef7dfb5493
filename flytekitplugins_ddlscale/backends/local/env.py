"""The connection variables Domino injects into a run, for a local cluster.

User code written for Domino finds its Dask cluster through
``DASK_SCHEDULER_SERVICE_HOST``/``DASK_SCHEDULER_SERVICE_PORT``; setting the
same variables for a local cluster lets that code run unchanged.
"""
from typing import Dict

from ...environ import environ_set

DASK_HOST_ENV = "DASK_SCHEDULER_SERVICE_HOST"
DASK_PORT_ENV = "DASK_SCHEDULER_SERVICE_PORT"

__all__ = ["DASK_HOST_ENV", "DASK_PORT_ENV", "dask_env", "environ_set"]


def dask_env(host: str, port: int) -> Dict[str, str]:
    """The Domino variables naming a Dask scheduler at ``host:port``."""
    return {DASK_HOST_ENV: host, DASK_PORT_ENV: str(port)}
