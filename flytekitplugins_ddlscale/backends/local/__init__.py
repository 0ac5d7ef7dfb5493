"""The local backend: real local Dask clusters, the default when nothing else is configured.

See :class:`LocalBackend` and ``docs/local.md``.
"""
from ._backend import DEFAULT_MAX_WORKERS, LocalBackend
from ..._core.lifetime import environ_set
from ._driver import DASK_HOST_ENV, DASK_PORT_ENV, dask_env
from ._tiers import LOCAL_TIERS_ENV, default_tiers_file

__all__ = [
    "DASK_HOST_ENV",
    "DASK_PORT_ENV",
    "DEFAULT_MAX_WORKERS",
    "LOCAL_TIERS_ENV",
    "LocalBackend",
    "dask_env",
    "default_tiers_file",
    "environ_set",
]
