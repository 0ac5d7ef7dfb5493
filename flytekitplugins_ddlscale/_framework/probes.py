"""What each framework's head serves over HTTP and how many workers its JSON counts: one :class:`Probe` per
framework, read without a client library or redirects (docs/readiness.md, What is read). A payload of another
shape is a :class:`ValueError`; :func:`idle_worker_ips` asks a Ray head which worker nodes are idle."""
import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional

from .._core import settings
from .._core.peerowner import NoRedirects, own_peer_opener
from .endpoints import framework_of

logger = logging.getLogger("flytekitplugins_ddlscale")

RAY_LIST_LIMIT = 10000
"""``limit`` of the Ray node list: the State API refuses more (RAY_MAX_LIMIT_FROM_API_SERVER)."""
MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""Largest status answer read (a Ray node list of 10000 nodes is a few MB)."""

_OPENER = urllib.request.build_opener(NoRedirects())
"""The probes' opener: the head's own URL only (a redirect could point anywhere, even at ``ftp://``)."""
_CREDENTIALS_OPENER = own_peer_opener()
"""The opener of reads carrying a token: to a loopback port, only once this user's process accepted."""


def get_json_body(url: str, headers: Dict[str, str], timeout: float) -> bytes:
    """The body of a GET of ``url`` asking for JSON (with ``headers``), redirects not followed; at most
    :data:`MAX_ANSWER_BYTES` + 1 bytes, so a longer answer shows. Raises what ``urllib`` raises; a read
    carrying ``Authorization`` to a loopback port held by another user sends nothing and raises
    :class:`~flytekitplugins_ddlscale._core.peerowner.ForeignListenerError` (an ``OSError``) inside a ``URLError``."""
    request = urllib.request.Request(url, headers={"Accept": "application/json", **headers})
    opener = _CREDENTIALS_OPENER if "Authorization" in headers else _OPENER
    with opener.open(request, timeout=timeout) as reply:
        return reply.read(MAX_ANSWER_BYTES + 1)


def ray_token(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The token Ray would send under ``environ`` (default: this process's): with ``RAY_AUTH_MODE=token``,
    ``$RAY_AUTH_TOKEN``, else the file ``$RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``; None when
    token authentication is off or no token is found."""
    mode = settings.RAY_AUTH_MODE.value(env=environ)
    if (mode or "").lower() != "token":
        return None
    token = settings.RAY_AUTH_TOKEN.value(env=environ)
    if token:
        return token
    path = settings.RAY_AUTH_TOKEN_PATH.value(env=environ)
    try:
        token = Path(path or Path.home() / ".ray" / "auth_token").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return token or None


def ray_auth_headers(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``{"Authorization": "Bearer <token>"}`` for :func:`ray_token`, or no header."""
    token = ray_token(environ)
    return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True)
class Probe:
    """How to count registered workers on one framework's head."""

    kind: str
    registry: str
    """Who the workers register with, in words: ``the Dask scheduler``."""
    path: str
    """Path and query appended to the head's base URL."""
    count: Callable[[Any], int]
    """Registered workers in the decoded JSON payload; ValueError if it has another shape."""

    def url(self, base: str) -> str:
        """The full URL on the head at ``base``."""
        return base.rstrip("/") + self.path


def _dask_workers(payload: Any) -> int:
    if not isinstance(payload, dict) or not isinstance(payload.get("workers"), int):
        raise ValueError("not a Dask scheduler /json/counts.json payload (no integer 'workers')")
    return payload["workers"]


def ray_alive_nodes(payload: Any) -> List[Dict[str, Any]]:
    """The ALIVE entries of a Ray State API node list; ValueError if ``payload`` is not one."""
    data = payload.get("data") if isinstance(payload, dict) else None
    listing = data.get("result") if isinstance(data, dict) else None
    nodes = listing.get("result") if isinstance(listing, dict) else None
    if not isinstance(nodes, list):
        # Nothing of the answer goes into the message: it may come from any service the URL names.
        raise ValueError("not a Ray State API node list (no data.result.result)")
    return [n for n in nodes if isinstance(n, dict) and n.get("state") == "ALIVE"]


def _ray_workers(payload: Any) -> int:
    alive = ray_alive_nodes(payload)
    if all("is_head_node" in n for n in alive):
        return sum(1 for n in alive if not n["is_head_node"])
    # Ray before 2.7 does not mark the head in this list; the head is one ALIVE node.
    return max(0, len(alive) - 1)


def _spark_workers(payload: Any) -> int:
    if not isinstance(payload, dict):
        raise ValueError("not a Spark master /json/ payload")
    alive = payload.get("aliveworkers")
    if isinstance(alive, int):
        return alive
    workers = payload.get("workers")
    if not isinstance(workers, list):
        raise ValueError("not a Spark master /json/ payload (no 'aliveworkers' or 'workers')")
    return sum(1 for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE")


PROBES: Dict[str, Probe] = {
    "dask": Probe("dask", "the Dask scheduler", "/json/counts.json", _dask_workers),
    "ray": Probe(
        "ray",
        "the Ray head",
        f"/api/v0/nodes?limit={RAY_LIST_LIMIT}&filter_keys=state&filter_predicates=%3D&filter_values=ALIVE",
        _ray_workers,
    ),
    "spark": Probe("spark", "the Spark master", "/json/", _spark_workers),
}


def probe_for(kind: str) -> Optional[Probe]:
    """The probe of ``kind`` (of its framework: ``ray`` for ``kuberay``...), or None for kinds
    without a head to ask (MPI)."""
    return PROBES.get(framework_of(kind))


_PATHS = {
    "nodes": ("/api/v0/nodes", "ALIVE"),
    "actors": ("/api/v0/actors", "ALIVE"),
    "tasks": ("/api/v0/tasks", "RUNNING"),
}


class _Unclear(Exception):
    """One read did not give a complete, well-formed list."""


def _listing(base: str, what: str, timeout: float) -> List[Dict[str, Any]]:
    path, state = _PATHS[what]
    url = (f"{base.rstrip('/')}{path}?limit={RAY_LIST_LIMIT}"
           f"&filter_keys=state&filter_predicates=%3D&filter_values={state}")
    try:
        body = get_json_body(url, ray_auth_headers(), timeout)
    except urllib.error.HTTPError as error:
        error.close()
        raise _Unclear(f"HTTP {error.code} from {path}") from None
    except Exception as error:  # noqa: BLE001 - any failed read means "unknown"
        raise _Unclear(f"{type(error).__name__} reading {path}") from None
    try:
        listing = json.loads(body.decode("utf-8"))["data"]["result"]
        entries = listing["result"]
        # Ray truncates at the limit before filtering: fewer kept than there are means some were never seen.
        complete = int(listing["num_after_truncation"]) >= int(listing["total"]) and not listing.get(
            "partial_failure_warning")
    except (ValueError, KeyError, TypeError):
        raise _Unclear(f"not a Ray State API list from {path}") from None
    if not isinstance(entries, list) or not complete:
        raise _Unclear(f"an incomplete list from {path}")
    return [e for e in entries if isinstance(e, dict)]


def idle_worker_ips(base: str, timeout: float) -> Optional[FrozenSet[str]]:
    """The ``node_ip`` of each idle ALIVE worker node of the Ray head whose dashboard is at ``base``
    (``http://host:8265``); None when the head did not tell (see the module docstring)."""
    try:
        nodes = _listing(base, "nodes", timeout)
        busy = {e.get("node_id") for what in ("actors", "tasks") for e in _listing(base, what, timeout)}
    except _Unclear as unclear:
        logger.debug("idle Ray workers unknown at %s: %s", base, unclear)
        return None
    return frozenset(
        str(n["node_ip"]) for n in nodes
        if n.get("state") == "ALIVE" and n.get("is_head_node") is False and n.get("node_ip")
        and n.get("node_id") not in busy
    )
