"""The connection variables Domino injects into a run, for a local cluster.

User code written for Domino finds its Dask cluster through
``DASK_SCHEDULER_SERVICE_HOST``/``DASK_SCHEDULER_SERVICE_PORT`` and its Ray
cluster through ``RAY_HEAD_SERVICE_HOST``/``RAY_HEAD_SERVICE_PORT`` (the Ray
client port: ``ray.init(f"ray://{host}:{port}")``); setting the same
variables for a local cluster lets that code run unchanged.
"""
from typing import Dict

from ..._core import settings
from ..._core.lifetime import environ_set

DASK_HOST_ENV = settings.DASK_SCHEDULER_SERVICE_HOST.name
DASK_PORT_ENV = settings.DASK_SCHEDULER_SERVICE_PORT.name

RAY_HOST_ENV = settings.RAY_HEAD_SERVICE_HOST.name
RAY_PORT_ENV = settings.RAY_HEAD_SERVICE_PORT.name
RAY_DASHBOARD_PORT_ENV = settings.RAY_DASHBOARD_PORT.name

__all__ = ["DASK_HOST_ENV", "DASK_PORT_ENV", "RAY_HOST_ENV", "RAY_PORT_ENV", "dask_env", "environ_set", "ray_env"]


def dask_env(host: str, port: int) -> Dict[str, str]:
    """The Domino variables naming a Dask scheduler at ``host:port``."""
    return {DASK_HOST_ENV: host, DASK_PORT_ENV: str(port)}


def ray_env(host: str, client_port: int, dashboard_port: int) -> Dict[str, str]:
    """The Domino variables naming a Ray head at ``host`` (client server on ``client_port``), plus
    ``$DDLSCALE_RAY_DASHBOARD_PORT``: a local dashboard is not on Domino's 8265, and the framework
    check finds the head from ``RAY_HEAD_SERVICE_HOST`` and that port."""
    return {RAY_HOST_ENV: host, RAY_PORT_ENV: str(client_port), RAY_DASHBOARD_PORT_ENV: str(dashboard_port)}
