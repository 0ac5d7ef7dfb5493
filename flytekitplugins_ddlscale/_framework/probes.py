"""What each framework's head serves over HTTP, and how many workers its JSON says have joined.

One :class:`Probe` per framework, each reading an endpoint the head serves
without any client library:

* Dask: the scheduler's HTTP server (the dashboard port) ``GET /json/counts.json``;
  its ``workers`` field counts the workers registered with the scheduler.
* Ray: the dashboard's State API ``GET /api/v0/nodes`` filtered to ALIVE nodes;
  worker nodes are the ALIVE entries that are not the head.
* Spark standalone: the master web UI's ``GET /json/``; ``aliveworkers``
  (older masters: ``workers`` entries whose ``state`` is ``ALIVE``).

A payload of another shape raises :class:`ValueError`, which the wait treats
like an unreachable head (a proxy's error page, a head still starting).
"""
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from .endpoints import framework_of

RAY_LIST_LIMIT = 10000
"""``limit`` of the Ray node list: the State API refuses more (RAY_MAX_LIMIT_FROM_API_SERVER)."""


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
