"""Framework readiness: workers registered with Dask, Ray or Spark (asked of the head over its own HTTP/JSON
endpoints), not just pods that exist. :mod:`.probes` reads each head, :mod:`.endpoints` finds it, :mod:`.wait`
waits; docs/readiness.md."""
from .endpoints import enabled_by_env, resolve_endpoint
from .probes import PROBES, probe_for
from .wait import wait_registered

__all__ = ["PROBES", "enabled_by_env", "probe_for", "resolve_endpoint", "wait_registered"]
