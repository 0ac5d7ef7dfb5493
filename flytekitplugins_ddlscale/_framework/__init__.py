"""Framework readiness: workers registered with Dask, Ray or Spark, not just pods that exist.

A pod can exist, or even be Ready, before its worker process has joined the
scheduler, Ray head or Spark master. This layer asks the head itself over
the frameworks' own HTTP/JSON endpoints (standard library only, so no
framework client is needed in the task image):

* :mod:`.probes`     what each head serves, how it is read (Ray's token) and how to count its workers;
* :mod:`.endpoints`  where the head is (overrides, Domino's variables,
  ``spark.master`` as Spark reads it) and the on/off switch;
* :mod:`.wait`       the bounded waits (workers registered; removed workers dropped) that
  ride out an unreachable head.

The readiness every surface reports (a backend's pods plus these probes) is one
band up, in :mod:`flytekitplugins_ddlscale._services.readiness`.
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
