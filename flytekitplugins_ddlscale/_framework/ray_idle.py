"""Which Ray worker nodes are idle, as the Ray head's State API tells.

A worker node is idle here when it is ALIVE and no ALIVE actor and no
RUNNING task is on it (``GET /api/v0/nodes``, ``/api/v0/actors``,
``/api/v0/tasks`` of the head's dashboard, filtered by state). Nodes are
named by ``node_ip``, which on Kubernetes is the pod's ``status.podIP``.
Any doubt gives None (the caller then keeps its own rule): a head that does
not answer, answers with something else, refuses the read, or truncated a
list. The token of Ray's token authentication is sent as the framework check
sends it (:mod:`.ray_auth`). Redirects are not followed and nothing of an
answer reaches a message.
"""
import json
import logging
import urllib.error
from typing import Any, Dict, FrozenSet, List, Optional

from .probes import RAY_LIST_LIMIT
from .ray_auth import ray_auth_headers
from .wait import get_json_body

logger = logging.getLogger("flytekitplugins_ddlscale")

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
