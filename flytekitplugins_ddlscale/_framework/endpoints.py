"""Where the cluster's head serves its framework status, and whether the check is on.

Precedence for the head's base URL (first match wins):

1. an explicit URL (``framework_url=`` on a node or phase, ``--framework-url``);
2. ``$DDLSCALE_<KIND>_URL`` (``DDLSCALE_DASK_URL``, ``DDLSCALE_RAY_URL``, ``DDLSCALE_SPARK_URL``);
3. ``$DDLSCALE_FRAMEWORK_URL``;
4. what Domino gives the run: Dask ``$DASK_SCHEDULER_SERVICE_HOST`` with the
   dashboard port (``$DDLSCALE_DASK_DASHBOARD_PORT``, default 8787); Ray
   ``$RAY_HEAD_SERVICE_HOST`` with the dashboard port
   (``$DDLSCALE_RAY_DASHBOARD_PORT``, default 8265); Spark the host of
   ``spark.master`` (:mod:`.spark_conf`) with the master web UI port
   (``$DDLSCALE_SPARK_WEBUI_PORT``, else ``$SPARK_MASTER_WEBUI_PORT``, default 8080).

``$DDLSCALE_FRAMEWORK_READINESS=off`` switches every check off.

A URL with credentials (``http://user:password@host``) is refused wherever
it comes from: the check sends none, and the URL would carry them into
templates, logs and messages.
"""
from dataclasses import dataclass
from typing import Mapping, Optional

from .._core import settings
from .._core.validation import validate_url
from ..refs import KINDS
from .spark_conf import configured_master, master_host

_HOSTS = {
    "dask": (settings.DASK_SCHEDULER_SERVICE_HOST, settings.DASK_DASHBOARD_PORT),
    "ray": (settings.RAY_HEAD_SERVICE_HOST, settings.RAY_DASHBOARD_PORT),
}


@dataclass(frozen=True)
class Endpoint:
    """The head's base URL for one kind, and where that address came from."""

    kind: str
    url: str
    source: str


def framework_of(kind: str) -> str:
    """The framework of a cluster kind: ``ray`` for ``kuberay``, ``dask`` for ``dask-operator``."""
    return KINDS[kind].framework if kind in KINDS else kind


def kind_url_env(kind: str) -> str:
    """The per-kind override variable: ``DDLSCALE_DASK_URL`` for ``dask``."""
    setting = settings.kind_url(kind)
    return setting.name if setting is not None else settings.FRAMEWORK_URL.name


def enabled_by_env(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``$DDLSCALE_FRAMEWORK_READINESS`` leaves the check on (unset: on)."""
    return bool(settings.FRAMEWORK_READINESS.value(env=env))


def _host_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def resolve_endpoint(kind: str, url: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> Optional[Endpoint]:
    """The head of the run's ``kind`` cluster, or None when nothing says where it is."""
    kind = framework_of(kind)
    if url is not None:
        return Endpoint(kind, validate_url(url) or "", "framework_url argument")
    for setting in (settings.kind_url(kind), settings.FRAMEWORK_URL):
        found = setting.value(env=env) if setting is not None else None
        if found:
            return Endpoint(kind, found, f"${setting.name}")
    if kind in _HOSTS:
        host_setting, port_setting = _HOSTS[kind]
        host = host_setting.value(env=env)
        if not host:
            return None
        port = port_setting.value(env=env)
        return Endpoint(kind, _host_url(host, port), f"${host_setting.name}, port {port}")
    if kind == "spark":
        found_master = configured_master(settings.environment(env))
        host = master_host(found_master[0]) if found_master else None
        if found_master is None or host is None:
            return None
        port = settings.SPARK_WEBUI_PORT.value(env=env) or settings.SPARK_MASTER_WEBUI_PORT.value(env=env)
        return Endpoint(kind, _host_url(host, port), f"{found_master[1]}, web UI port {port}")
    return None


def where_to_set(kind: str) -> str:
    """What a user sets so the head of ``kind`` can be found (for 'not checked' messages)."""
    kind = framework_of(kind)
    domino = {
        "dask": f"${settings.DASK_SCHEDULER_SERVICE_HOST.name}",
        "ray": f"${settings.RAY_HEAD_SERVICE_HOST.name}",
        "spark": f"spark.master in spark-defaults.conf or ${settings.SPARK_MASTER.name}",
    }.get(kind)
    own = " or ".join(f"${name}" for name in dict.fromkeys((kind_url_env(kind), settings.FRAMEWORK_URL.name)))
    return f"{domino}, {own}" if domino else own
