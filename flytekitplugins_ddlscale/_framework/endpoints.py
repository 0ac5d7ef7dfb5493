"""Where the cluster's head serves its framework status (first match: an explicit URL, ``$DDLSCALE_<KIND>_URL``,
``$DDLSCALE_FRAMEWORK_URL``, what Domino gives the run; docs/readiness.md), and whether the check is on. A URL
with credentials is refused wherever it comes from."""
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Tuple

from .._core import settings
from .._core.validation import validate_url
from ..refs import KINDS

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


DEFAULTS_FILE = "spark-defaults.conf"
_SEPARATOR = re.compile(r"\s*[=:\s]\s*")


def read_properties(text: str) -> dict:
    """Key/value pairs of a Java-properties style file (``key value``, ``key=value`` or ``key: value``)."""
    values = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        parts = _SEPARATOR.split(line, maxsplit=1)
        values[parts[0]] = parts[1].strip() if len(parts) > 1 else ""
    return values


def master_host(master: str) -> Optional[str]:
    """The host of a standalone master URL (``spark://h:7077``, first of ``spark://h1:7077,h2:7077``); None
    for masters without a standalone master web UI (``local[*]``, ``yarn``, ``k8s://...``)."""
    text = master.strip()
    if not text.startswith("spark://"):
        return None
    first = text[len("spark://"):].split(",")[0]
    host = first.rsplit(":", 1)[0] if ":" in first else first
    return host.strip("[]") or None


def configured_master(env: Mapping[str, str]) -> Optional[Tuple[str, str]]:
    """``(master URL, where it was found)`` from the environment or ``spark-defaults.conf``; None if unset."""
    master = settings.SPARK_MASTER.raw(env)
    if master:
        return master, f"${settings.SPARK_MASTER.name}"
    # As Spark itself: $SPARK_CONF_DIR replaces $SPARK_HOME/conf, it does not add to it.
    conf_dir, home = settings.SPARK_CONF_DIR.raw(env), settings.SPARK_HOME.raw(env)
    if conf_dir:
        path = Path(conf_dir) / DEFAULTS_FILE
    elif home:
        path = Path(home) / "conf" / DEFAULTS_FILE
    else:
        return None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    master = read_properties(text).get("spark.master")
    return (master, f"spark.master in {path}") if master else None


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
