"""The part of a Ray head's dashboard (port 8265) that readiness reads: the State API node list.

``GET /api/v0/nodes`` as Ray's dashboard serves it (state_head.py ->
state_api_utils.handle_list_api -> optional_utils.rest_response)::

    {"result": true, "msg": "", "data": {"result": {
        "total": 3, "num_after_truncation": 3, "num_filtered": 2,
        "result": [{"node_id": "...", "node_ip": "10.0.0.10", "is_head_node": false,
                    "state": "ALIVE", "state_message": null, "node_name": "10.0.0.10",
                    "resources_total": {"CPU": 4.0}, "labels": {...}}, ...],
        "partial_failure_warning": "", "warnings": null}}}

Rules enforced as Ray does: ``limit`` above 10000 (RAY_MAX_LIMIT_FROM_API_SERVER)
or a filter on a column that is not filterable answers 400 with ``result:
false`` and the message; filters are ``filter_keys``/``filter_predicates``/
``filter_values`` triples with ``=`` or ``!=``, string values compared
case-insensitively. The head is itself an ALIVE node. ``legacy=True`` plays
Ray before 2.7, whose node entries have no ``is_head_node``. Other paths 404.

``/api/v0/tasks`` lists one RUNNING task on each node a test made busy
(:meth:`RayDashboardServer.node`, named by a pod's IP), ``/api/v0/actors``
no actors; both filter and answer as the node list does.

``token`` plays a head started with ``RAY_AUTH_MODE=token`` (Ray's
``http_token_authentication`` middleware): the token comes in ``Authorization``
(``Bearer <token>``), else ``X-Ray-Authorization``; none answers 401
``Unauthorized: Missing authentication token``, another 403 ``Forbidden:
Invalid authentication token`` (plain text).
"""
from typing import Any, Dict, List, Optional, Tuple

from .status_http import Reply, StatusServer

MAX_LIMIT = 10000
DEFAULT_LIMIT = 100
FILTERABLE = ("node_id", "node_ip", "is_head_node", "state", "node_name")


class RayDashboardServer(StatusServer):
    """A Ray head's dashboard with a head node and workers that join when the test says."""

    def __init__(self, legacy: bool = False, token: Optional[str] = None) -> None:
        super().__init__()
        self.legacy = legacy
        self.token = token

    def refuse(self, headers: Any) -> Optional[Tuple[int, str]]:
        if self.token is None:
            return None
        sent = headers.get("Authorization") or headers.get("X-Ray-Authorization") or ""
        if not sent:
            return 401, "Unauthorized: Missing authentication token"
        if sent.removeprefix("Bearer ") != self.token:
            return 403, "Forbidden: Invalid authentication token"
        return None

    def _node(self, node_id: str, ip: str, head: bool, alive: bool) -> Dict[str, Any]:
        node = {
            "node_id": node_id,
            "node_ip": ip,
            "state": "ALIVE" if alive else "DEAD",
            "state_message": None if alive else "Expected termination: received SIGTERM",
            "node_name": ip,
            "resources_total": {"CPU": 4.0, "memory": 8.0e9, "node:" + ip: 1.0},
            "labels": {"ray.io/node_id": node_id},
        }
        if not self.legacy:
            node["is_head_node"] = head
        return node

    def node(self, ip: str, busy: bool = False) -> None:
        """A worker node at ``ip`` (a pod's IP) registered now; ``busy``: a task RUNNING on it."""
        self.join_after(0)[0].host = ip
        self.set_busy(ip, busy)

    def set_busy(self, ip: str, busy: bool) -> None:
        """Whether a task is RUNNING on the node at ``ip``."""
        with self._lock:
            for worker in self._workers:
                if worker.host == ip:
                    worker.extra["busy"] = busy

    def route(self, path: str, query: Dict[str, List[str]]) -> Reply:
        if path in ("/api/v0/tasks", "/api/v0/actors"):
            return self._work(path, query)
        if path != "/api/v0/nodes":
            return 404, None, {}
        try:
            limit = int(query.get("limit", [DEFAULT_LIMIT])[0])
            if limit > MAX_LIMIT:
                raise ValueError(f"Given limit {limit} exceeds the supported limit {MAX_LIMIT}.")
            filters = list(zip(query.get("filter_keys", []), query.get("filter_predicates", []),
                               query.get("filter_values", [])))
            now, workers = self.workers_now()
            nodes = [self._node("head0000", "10.0.0.1", True, True)]
            nodes += [self._node(w.worker_id, w.host, False, w.alive(now)) for w in workers]
            matched = [n for n in nodes if _matches(n, filters)]
        except ValueError as error:
            return 400, {"result": False, "msg": str(error), "data": {"result": None}}, {}
        listing = {
            "total": len(nodes),
            "num_after_truncation": len(nodes),
            "num_filtered": len(matched),
            "result": matched[:limit],
            "partial_failure_warning": "",
            "warnings": None,
        }
        return 200, {"result": True, "msg": "", "data": {"result": listing}}, {}


    def _work(self, path: str, query: Dict[str, List[str]]) -> Reply:
        """The RUNNING tasks (one per busy node) or ALIVE actors (none) as Ray lists them."""
        now, workers = self.workers_now()
        entries: List[Dict[str, Any]] = []
        if path.endswith("tasks"):
            entries = [{"task_id": f"task-{w.worker_id}", "name": "work", "state": "RUNNING", "node_id": w.worker_id,
                        "type": "NORMAL_TASK"} for w in workers if w.alive(now) and w.extra.get("busy")]
        try:
            filters = list(zip(query.get("filter_keys", []), query.get("filter_predicates", []),
                               query.get("filter_values", [])))
            matched = [e for e in entries if _matches(e, filters, ("state", "node_id", "task_id", "actor_id"))]
        except ValueError as error:
            return 400, {"result": False, "msg": str(error), "data": {"result": None}}, {}
        listing = {"total": len(entries), "num_after_truncation": len(entries), "num_filtered": len(matched),
                   "result": matched, "partial_failure_warning": "", "warnings": None}
        return 200, {"result": True, "msg": "", "data": {"result": listing}}, {}


def _matches(node: Dict[str, Any], filters: List[tuple], filterable: Tuple[str, ...] = FILTERABLE) -> bool:
    for key, predicate, value in filters:
        if key not in filterable:
            raise ValueError(f"The given filter column {key} is not supported.")
        if predicate not in ("=", "!="):
            raise ValueError(f"Unsupported filter predicate {predicate} is given.")
        if key not in node:
            return False
        actual = node[key]
        equal = actual.lower() == value.lower() if isinstance(actual, str) else str(actual).lower() == value.lower()
        if equal != (predicate == "="):
            return False
    return True
