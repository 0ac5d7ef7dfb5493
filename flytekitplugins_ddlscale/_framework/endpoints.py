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
import os
from dataclasses import dataclass
from typing import Mapping, Optional
from urllib.parse import urlsplit

from ..errors import InvalidInputError
from .._core.redaction import mask_userinfo, register_secret
from ..refs import KINDS
from .spark_conf import configured_master, master_host

SWITCH_ENV = "DDLSCALE_FRAMEWORK_READINESS"
URL_ENV = "DDLSCALE_FRAMEWORK_URL"
_OFF = ("off", "0", "false", "no")
_ON = ("", "on", "1", "true", "yes")

DASK_DASHBOARD_PORT = 8787
RAY_DASHBOARD_PORT = 8265
SPARK_WEBUI_PORT = 8080

_HOSTS = {
    "dask": ("DASK_SCHEDULER_SERVICE_HOST", "DDLSCALE_DASK_DASHBOARD_PORT", DASK_DASHBOARD_PORT),
    "ray": ("RAY_HEAD_SERVICE_HOST", "DDLSCALE_RAY_DASHBOARD_PORT", RAY_DASHBOARD_PORT),
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
    return f"DDLSCALE_{kind.upper()}_URL"


def validate_url(value: object, field: str = "framework_url") -> Optional[str]:
    """``value`` as a base URL without a trailing slash; None stays None.

    Raises :class:`InvalidInputError` naming ``field`` for anything but an
    ``http(s)://host[:port]`` URL, and for a URL carrying ``user:password@``
    (the error shows it masked).
    """
    if value is None:
        return None
    allowed = "an http:// or https:// URL of the cluster head's dashboard or web UI (e.g. http://host:8787), or None"
    if not isinstance(value, str):
        raise InvalidInputError(field, value, allowed)
    parts = urlsplit(value.strip())
    if "@" in parts.netloc:
        # Refused rather than sent: the URL travels in task templates, resource metadata and
        # messages, and urllib would hand "user:password@host" to the resolver as a host name.
        if parts.password:
            register_secret(parts.password)
        raise InvalidInputError(
            field, mask_userinfo(value.strip()), allowed,
            reason="credentials in the URL (user:password@) are not accepted: the framework check sends "
            "no credentials; give the head's URL without them, or switch the framework check off",
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInputError(field, value, allowed)
    try:
        parts.port
    except ValueError:
        raise InvalidInputError(field, value, allowed) from None
    return value.strip().rstrip("/")


def enabled_by_env(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``$DDLSCALE_FRAMEWORK_READINESS`` leaves the check on (unset: on)."""
    environ = os.environ if env is None else env
    value = environ.get(SWITCH_ENV, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise InvalidInputError(SWITCH_ENV, environ.get(SWITCH_ENV), "on/off (also 1/0, true/false, yes/no)")


def _port(environ: Mapping[str, str], names: tuple, default: int) -> int:
    for name in names:
        text = environ.get(name, "").strip()
        if text:
            if not text.isdigit() or not 0 < int(text) < 65536:
                raise InvalidInputError(name, text, "a TCP port number from 1 to 65535")
            return int(text)
    return default


def _host_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def resolve_endpoint(kind: str, url: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> Optional[Endpoint]:
    """The head of the run's ``kind`` cluster, or None when nothing says where it is."""
    kind = framework_of(kind)
    environ = os.environ if env is None else env
    if url is not None:
        return Endpoint(kind, validate_url(url) or "", "framework_url argument")
    for name in (kind_url_env(kind), URL_ENV):
        if environ.get(name, "").strip():
            return Endpoint(kind, validate_url(environ[name], name) or "", f"${name}")
    if kind in _HOSTS:
        host_var, port_var, default = _HOSTS[kind]
        host = environ.get(host_var, "").strip()
        if not host:
            return None
        port = _port(environ, (port_var,), default)
        return Endpoint(kind, _host_url(host, port), f"${host_var}, port {port}")
    if kind == "spark":
        found = configured_master(environ)
        host = master_host(found[0]) if found else None
        if found is None or host is None:
            return None
        port = _port(environ, ("DDLSCALE_SPARK_WEBUI_PORT", "SPARK_MASTER_WEBUI_PORT"), SPARK_WEBUI_PORT)
        return Endpoint(kind, _host_url(host, port), f"{found[1]}, web UI port {port}")
    return None


def where_to_set(kind: str) -> str:
    """What a user sets so the head of ``kind`` can be found (for 'not checked' messages)."""
    kind = framework_of(kind)
    domino = {
        "dask": "$DASK_SCHEDULER_SERVICE_HOST",
        "ray": "$RAY_HEAD_SERVICE_HOST",
        "spark": "spark.master in spark-defaults.conf or $SPARK_MASTER",
    }.get(kind)
    own = f"${kind_url_env(kind)} or ${URL_ENV}"
    return f"{domino}, {own}" if domino else own
