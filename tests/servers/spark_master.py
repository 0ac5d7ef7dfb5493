"""The part of a Spark standalone master's web UI (port 8080) that readiness reads: ``GET /json/``.

Payload as ``JsonProtocol.writeMasterState`` writes it::

    {"url": "spark://10.0.0.1:7077", "workers": [{"id": "worker-...", "host": "10.0.0.10",
     "port": 34567, "webuiaddress": "http://10.0.0.10:8081", "cores": 4, "coresused": 0,
     "coresfree": 4, "memory": 7168, "memoryused": 0, "memoryfree": 7168, "resources": {},
     "resourcesused": {}, "resourcesfree": {}, "state": "ALIVE", "lastheartbeat": 1700000000000}],
     "aliveworkers": 1, "cores": 4, "coresused": 0, "memory": 7168, "memoryused": 0,
     "resources": [], "resourcesused": [], "activeapps": [], "completedapps": [],
     "activedrivers": [], "completeddrivers": [], "status": "ALIVE"}

Dead workers stay listed with ``state: DEAD`` and are not counted in
``aliveworkers``. ``/json`` redirects to ``/json/`` (Jetty). ``legacy=True``
plays masters before Spark 2.x that have no ``aliveworkers``.
"""
import time
from typing import Any, Dict, List

from .status_http import Reply, StatusServer


class SparkMasterServer(StatusServer):
    """A Spark standalone master with workers that join when the test says."""

    def __init__(self, legacy: bool = False) -> None:
        super().__init__()
        self.legacy = legacy

    def route(self, path: str, query: Dict[str, List[str]]) -> Reply:
        if path == "/json":
            return 302, None, {"Location": f"{self.url}/json/"}
        if path != "/json/":
            return 404, None, {}
        now, workers = self.workers_now()
        listed = [self._worker(w.worker_id, w.host, w.alive(now)) for w in workers]
        alive = [w for w in listed if w["state"] == "ALIVE"]
        payload: Dict[str, Any] = {
            "url": "spark://10.0.0.1:7077",
            "workers": listed,
            "cores": sum(w["cores"] for w in alive),
            "coresused": 0,
            "memory": sum(w["memory"] for w in alive),
            "memoryused": 0,
            "resources": [],
            "resourcesused": [],
            "activeapps": [],
            "completedapps": [],
            "activedrivers": [],
            "completeddrivers": [],
            "status": "ALIVE",
        }
        if not self.legacy:
            payload["aliveworkers"] = len(alive)
        return 200, payload, {}

    @staticmethod
    def _worker(worker_id: str, host: str, alive: bool) -> Dict[str, Any]:
        return {
            "id": f"worker-20260101000000-{host}-34567-{worker_id}",
            "host": host,
            "port": 34567,
            "webuiaddress": f"http://{host}:8081",
            "cores": 4,
            "coresused": 0,
            "coresfree": 4,
            "memory": 7168,
            "memoryused": 0,
            "memoryfree": 7168,
            "resources": {},
            "resourcesused": {},
            "resourcesfree": {},
            "state": "ALIVE" if alive else "DEAD",
            "lastheartbeat": int(time.time() * 1000),
        }
