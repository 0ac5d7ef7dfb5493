"""Framework readiness: workers registered with Dask, Ray or Spark, not just pods that exist.

A pod can be Ready before its worker has joined the scheduler, Ray head or Spark master, so this layer
asks the head itself over its own HTTP/JSON endpoints (standard library only): :mod:`.probes` what each
head serves and how it is read, :mod:`.endpoints` where the head is, :mod:`.wait` the bounded waits.
The readiness every surface reports is one band up, in :mod:`~flytekitplugins_ddlscale._services.readiness`.
"""
from .endpoints import enabled_by_env, resolve_endpoint
from .probes import PROBES, probe_for
from .wait import wait_registered

__all__ = [
    "PROBES",
    "enabled_by_env",
    "probe_for",
    "resolve_endpoint",
    "wait_registered",
]
