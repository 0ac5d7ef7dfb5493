"""The project's test servers, wrapped to record the exact moments benchmarks need.

Detection lag is "when the client returned" minus "when the last worker (or
the new head) became Ready". The test servers decide those moments
themselves; these subclasses note them as the server sets them, on the same
clock (``time.time()``, same process) as the client's return, so the lag is
exact rather than estimated. They add no behaviour: every request is still
answered by the unmodified server.
"""
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from tests.servers.scaler_server import ScalerTestServer


class TimedScalerServer(ScalerTestServer):
    """:class:`ScalerTestServer` that records when scaled workers and restarted heads are up.

    The scaler test server fixes those moments when it accepts the PATCH
    (``now + pod delay``; ``now + recreate + ready delay`` for a head), so
    they are read from its cluster model right after it answers.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._moments: Dict[Tuple[str, str], float] = {}

    def _route(self, method: str, path: str, req: Any) -> Any:
        answer = super()._route(method, path, req)
        parts = path.strip("/").split("/")
        if method == "PATCH" and len(parts) == 4 and parts[0] == "ddl_cluster_scaler" and answer[0] in (200, 202):
            operation, plural, name = parts[1], parts[2], parts[3]
            with self._lock:
                cluster = self._clusters.get((plural, name))
                if cluster is not None and operation == "scale":
                    replicas = cluster.spec["worker"]["replicas"]
                    arriving = [cluster.worker_pods[i] for i in range(replicas) if i in cluster.worker_pods]
                    moments = arriving + list(cluster.leaving.values())
                    self._moments[("scale", name)] = max(moments) if moments else time.time()
                elif cluster is not None and operation == "restart_head":
                    self._moments[("restart", name)] = cluster.head_ready_at
        return answer

    def ready_moment(self, operation: str, name: str) -> float:
        """``time.time()`` at which the last change of the latest ``scale``/``restart`` of ``name`` completes."""
        with self._lock:
            return self._moments[(operation, name)]


def timed_k8s_server(**kwargs: Any) -> Any:
    """A started-later :class:`TimedK8sServer` (the Kubernetes test server is imported on demand)."""
    from tests.servers.k8s_server import K8sTestServer

    class TimedK8sServer(K8sTestServer):
        """:class:`K8sTestServer` that records when each pod was first stored Ready."""

        def __init__(self, **inner: Any) -> None:
            super().__init__(**inner)
            self._ready_lock = threading.Lock()
            self._ready_at: Dict[str, Tuple[float, str, str]] = {}

        def commit(self, resource: str, namespace: str, obj: Optional[Dict[str, Any]], name: str, event: str) -> Any:
            # Stamped before storing: watchers may wake (and clients return) as soon as it is stored.
            moment = time.time()
            stored = super().commit(resource, namespace, obj, name, event)
            if resource == "pods" and obj is not None and _is_ready(obj):
                from tests.servers.k8s_operator import pod_owner

                meta = obj.get("metadata") or {}
                # Any operator's pod (Domino's, KubeRay's, the Dask operator's): its cluster and role.
                owner = pod_owner(obj)
                cluster, component = (owner[0][2], owner[1]) if owner is not None else ("", "")
                with self._ready_lock:
                    self._ready_at.setdefault(str(meta.get("uid") or name), (moment, cluster, component))
            return stored

        def ready_moments(self, cluster: str, component: str = "worker", since: float = 0.0) -> List[float]:
            """When pods of ``cluster``/``component`` first became Ready, for those Ready after ``since``."""
            with self._ready_lock:
                return sorted(t for t, c, comp in self._ready_at.values() if c == cluster and comp == component and t >= since)

        def ready_moments_all(self, component: str = "worker") -> List[float]:
            """When each pod of ``component`` (any cluster) first became Ready."""
            with self._ready_lock:
                return sorted(t for t, _, comp in self._ready_at.values() if comp == component)

    return TimedK8sServer(**kwargs)


def _is_ready(pod: Dict[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
