"""The connection variables Domino injects into a run, for a local cluster.

User code written for Domino finds its Dask cluster through
``DASK_SCHEDULER_SERVICE_HOST``/``DASK_SCHEDULER_SERVICE_PORT``; setting the
same variables for a local cluster lets that code run unchanged.
"""
import contextlib
import os
from typing import Dict, Iterator, Mapping

DASK_HOST_ENV = "DASK_SCHEDULER_SERVICE_HOST"
DASK_PORT_ENV = "DASK_SCHEDULER_SERVICE_PORT"


def dask_env(host: str, port: int) -> Dict[str, str]:
    """The Domino variables naming a Dask scheduler at ``host:port``."""
    return {DASK_HOST_ENV: host, DASK_PORT_ENV: str(port)}


@contextlib.contextmanager
def environ_set(values: Mapping[str, str]) -> Iterator[Dict[str, str]]:
    """Set ``values`` in ``os.environ`` for the block; restore what was there before on exit."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield dict(values)
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
