"""Reading the test servers' request logs and state, shared by the reliability tests."""
from typing import Any, List

MUTATING = ("PATCH", "POST", "PUT", "DELETE")


def mutations(server: Any) -> List[Any]:
    """Requests that could have changed a cluster on the scaler test server."""
    return [r for r in server.requests if r.method in MUTATING and r.path.startswith("/ddl_cluster_scaler/")]


def scale_bodies(server: Any, name: str) -> List[Any]:
    """``replicas`` of every scale PATCH for cluster ``name`` that the server applied (HTTP 200), in order."""
    return [
        r.body.get("replicas")
        for r in server.requests
        if r.method == "PATCH" and "/scale/" in r.path and r.path.endswith("/" + name) and r.status == 200
    ]


def desired(server: Any, kind: str, name: str) -> int:
    """``spec.worker.replicas`` of a cluster on the scaler test server."""
    return int(server.cluster_object(kind, name)["spec"]["worker"]["replicas"])
