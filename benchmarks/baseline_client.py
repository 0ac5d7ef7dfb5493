"""The reference client's strategy, re-implemented as the benchmarks' baseline.

Domino's published reference client for the scaler service scales with one
PATCH and then polls the cluster every 2 s until ``status.nodes`` minus one
head equals the requested replicas; a head restart polls
``restart_head_status`` every 3 s. It has no timeout. This module speaks the
same REST protocol (docs/scaler.md) with the same fixed intervals so that the
plugin's backends can be compared with it on the same test server in the
same run. Its known body-key defect is left out: the benchmarks never send a
tier, so it would change nothing.

:class:`K8sPollingBaseline` is the same strategy against Kubernetes directly:
list the cluster's worker pods every 2 s and count the Ready ones.

``give_up_after`` is a guard of the benchmark harness, not part of the
strategy being modelled: a broken test server must not hang the suite.
"""
import ssl
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional

import httpx

SCALE_POLL_SECONDS = 2.0
RESTART_POLL_SECONDS = 3.0


class BaselineGaveUp(RuntimeError):
    """The harness guard fired: the awaited state never came."""


@dataclass
class BaselineWait:
    """What one baseline wait saw."""

    requests: int
    """HTTP requests this client sent for the operation (including the PATCH)."""
    returned_at: float
    """``time.time()`` when the wait returned."""


class ScalerPollingBaseline:
    """Fixed-interval polling client of the scaler service (the reference client's strategy)."""

    def __init__(self, base_url: str, api_key: str, give_up_after: float = 300.0) -> None:
        self._http = httpx.Client(base_url=base_url, headers={"X-Domino-Api-Key": api_key}, timeout=30.0)
        self._give_up_after = give_up_after

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> "ScalerPollingBaseline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def scale_and_wait(self, plural: str, name: str, replicas: int) -> BaselineWait:
        """PATCH the replicas, then GET the cluster every 2 s until ``len(status.nodes) - 1 == replicas``."""
        started = time.monotonic()
        answer = self._http.patch(f"/ddl_cluster_scaler/scale/{plural}/{name}", json={"replicas": replicas})
        answer.raise_for_status()
        sent = 1
        while True:
            obj = self._http.get(f"/ddl_cluster_scaler/cluster/{plural}/{name}")
            sent += 1
            obj.raise_for_status()
            nodes = (obj.json().get("status") or {}).get("nodes") or []
            if len(nodes) - 1 == replicas:
                return BaselineWait(sent, time.time())
            self._guard(started, f"{replicas} workers of {plural}/{name}")
            time.sleep(SCALE_POLL_SECONDS)

    def restart_and_wait(self, plural: str, name: str) -> BaselineWait:
        """PATCH restart_head, then GET restart_head_status every 3 s until ``restarted_and_ready``.

        Uses the service's own ``started_at``; a 404 (head being recreated) means "not yet".
        """
        started = time.monotonic()
        answer = self._http.patch(f"/ddl_cluster_scaler/restart_head/{plural}/{name}")
        answer.raise_for_status()
        started_at = answer.json()["started_at"]
        sent = 1
        while True:
            status = self._http.get(
                f"/ddl_cluster_scaler/restart_head_status/{plural}/{name}", params={"started_at": started_at}
            )
            sent += 1
            if status.status_code == 200 and status.json().get("status") == "restarted_and_ready":
                return BaselineWait(sent, time.time())
            if status.status_code not in (200, 404):
                status.raise_for_status()
            self._guard(started, f"head of {plural}/{name} restarted and ready")
            time.sleep(RESTART_POLL_SECONDS)

    def _guard(self, started: float, what: str) -> None:
        if time.monotonic() - started > self._give_up_after:
            raise BaselineGaveUp(f"baseline gave up after {self._give_up_after:.0f}s waiting for {what}")


class K8sPollingBaseline:
    """Fixed 2 s polling of a cluster's worker pods through the Kubernetes REST API."""

    def __init__(self, base_url: str, give_up_after: float = 300.0, token: Optional[str] = None,
                 ca: Optional[str] = None) -> None:
        """``token``: sent as a bearer token; ``ca``: the CA file that verifies the server (a real API server)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url, timeout=30.0, headers=headers,
                                 verify=ssl.create_default_context(cafile=ca) if ca else True)
        self._give_up_after = give_up_after

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> "K8sPollingBaseline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def scale_and_wait(self, group: str, version: str, namespace: str, plural: str, app: str,
                       name: str, replicas: int) -> BaselineWait:
        """Merge-patch ``spec.worker.replicas``, then list worker pods every 2 s until ``replicas`` are Ready."""
        started = time.monotonic()
        patched = self._http.patch(
            f"/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}",
            content=b'{"spec": {"worker": {"replicas": %d}}}' % replicas,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        patched.raise_for_status()
        sent = 1
        selector = (
            f"app.kubernetes.io/instance={name},app.kubernetes.io/component=worker,app.kubernetes.io/name={app}"
        )
        while True:
            listed = self._http.get(f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector})
            sent += 1
            listed.raise_for_status()
            pods = [p for p in listed.json().get("items", []) if not (p.get("metadata") or {}).get("deletionTimestamp")]
            if len(pods) == replicas and all(_ready(p) for p in pods):
                return BaselineWait(sent, time.time())
            self._guard(started, f"{replicas} Ready workers of {plural}/{name}")
            time.sleep(SCALE_POLL_SECONDS)

    def _guard(self, started: float, what: str) -> None:
        if time.monotonic() - started > self._give_up_after:
            raise BaselineGaveUp(f"baseline gave up after {self._give_up_after:.0f}s waiting for {what}")


def _ready(pod: Dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
