"""A protocol-true stand-in for Domino's ``ddl-cluster-scaler`` service, over real HTTP.

It follows the service's REST contract (docs/scaler.md) route by route,
including the service's rules and defects, so a client that works here
works against the real service:

* auth by ``X-Domino-Api-Key`` (preferred, like the service) or
  ``Authorization: Bearer``; the caller must be an admin or the cluster's
  ``dominodatalab.com/starting-user-id``. Unknown or expired credentials make
  the caller anonymous, which the service answers with ``403 unauthorized``
  (it asks Nucleus who the caller is and never answers 401 itself);
* ``GET /access-token`` plays ``$DOMINO_API_PROXY``: short-lived bearer tokens
  (``token_ttl``; :meth:`ScalerTestServer.expire_tokens` ages them at once);
* ``GET /v4/hardwareTier`` and ``/v4/auth/principal`` play Nucleus (401 for
  bad credentials);
* ``effective = min(requested, maxReplicas)``; only ``spec.worker.replicas``
  (and the tier fields) change; 409 without ``spec.autoscaling``;
  replicas parsed with ``int()`` as the service does (so ``"3"`` is accepted);
* restart deletes ``<name>-<kind prefix>-head-0`` (right for Ray only), so
  Spark and Dask answer 404; a missing cluster is ``500 get_failed`` whose
  ``details`` is the Kubernetes ``ApiException`` text;
* ``restart_head_status`` compares the new pod's ``creationTimestamp`` with
  the caller's ``started_at`` at one-second resolution and answers
  ``404 head_pod_not_found`` while the head is being recreated.

The in-memory cluster model adds worker pods to ``status.nodes`` after a
delay chosen by the test (:meth:`set_pod_ready_delay`), removes them after the
same delay on scale-down, and recreates a restarted head after
``head_recreate_delay`` (Ready ``head_ready_delay`` later).

Usage::

    with ScalerTestServer() as server:
        server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=4)
        server.inject_faults("status", count=2, status=503)
        ...  # point a client at server.url with api key DEFAULT_API_KEY
        assert server.count("PATCH", "/scale/") == 1
"""
import datetime
import json
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Set, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

NAMESPACE = "domino-compute"
OWNER_LABEL = "dominodatalab.com/starting-user-id"
TIER_LABEL = "dominodatalab.com/hardware-tier-id"
NODE_POOL = "dominodatalab.com/node-pool"
SERVED_KINDS = ("rayclusters", "sparkclusters", "daskclusters")

DEFAULT_USER = "owner-1"
DEFAULT_API_KEY = "test-api-key-owner-1"
DEFAULT_TOKEN = "test-bearer-owner-1"
ADMIN_USER = "admin-1"
ADMIN_API_KEY = "test-api-key-admin-1"
OTHER_USER = "other-1"
OTHER_API_KEY = "test-api-key-other-1"

# Real CRD layout (docs/kubernetes.md, "The custom resources"): app name, head component,
# CRD kind and head spec section.
_LAYOUT = {
    "rayclusters": ("ray", "head", "RayCluster", "head"),
    "sparkclusters": ("spark", "master", "SparkCluster", "master"),
    "daskclusters": ("dask", "scheduler", "DaskCluster", "scheduler"),
    "mpiclusters": ("mpi", None, "MPICluster", None),
}
_SHORT_TO_PLURAL = {"ray": "rayclusters", "spark": "sparkclusters", "dask": "daskclusters", "mpi": "mpiclusters"}


def default_tiers() -> List[Dict[str, Any]]:
    """A small Nucleus ``/v4/hardwareTier`` catalog: two general tiers, a GPU tier for Ray and a Spark-only tier."""

    def tier(tid: str, name: str, cores: float, mem: float, gpus: int = 0, **restrict: bool) -> Dict[str, Any]:
        return {
            "id": tid,
            "name": name,
            "nodePool": "gpu" if gpus else "default",
            "hwtResources": {
                "cores": cores,
                "coresLimit": cores,
                "memory": {"value": mem, "unit": "GiB"},
                "memoryLimit": {"value": mem, "unit": "GiB"},
            },
            "gpuConfiguration": {"numberOfGpus": gpus},
            "computeClusterRestrictions": {
                "restrictToSpark": restrict.get("spark", False),
                "restrictToRay": restrict.get("ray", False),
                "restrictToDask": restrict.get("dask", False),
                "restrictToMpi": restrict.get("mpi", False),
            },
        }

    return [
        tier("small-k8s", "Small", 1, 4),
        tier("medium-k8s", "Medium", 4, 16),
        tier("gpu-k8s", "GPU", 8, 60, gpus=1, ray=True),
        tier("spark-k8s", "Spark Only", 2, 8, spark=True),
    ]


def iso_seconds(epoch: float) -> str:
    """``epoch`` as the service writes times: ISO-8601, UTC, whole seconds, ``Z``."""
    moment = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_iso(text: Optional[str]) -> Optional[datetime.datetime]:
    if not text:
        return None
    value = text.strip()
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


def _api_exception_text(status: int, reason: str, name: str, what: str) -> str:
    # The service puts str(kubernetes.client.ApiException) into "details".
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": f'{what} "{name}" not found',
            "reason": reason,
            "code": status,
        }
    )
    return (
        f"({status})\nReason: Not Found\nHTTP response headers: "
        f"HTTPHeaderDict({{'Content-Type': 'application/json'}})\nHTTP response body: {body}\n"
    )


@dataclass
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    query: Dict[str, List[str]]
    headers: Dict[str, str]
    """Header names lower-cased."""
    body: Optional[Any]
    status: Optional[int] = None
    """Status answered; None when the connection was dropped."""
    at: float = field(default_factory=time.monotonic)
    """When the request arrived (``time.monotonic()``, same clock as the client in this process)."""


@dataclass
class Fault:
    """A planned misbehaviour for the next ``count`` matching requests."""

    kind: str
    """``status`` (answer ``status`` with an error body), ``drop`` (close without answering) or ``delay``."""
    count: int
    status: int = 503
    delay: float = 0.0
    path: str = "/ddl_cluster_scaler/"
    """Substring a request path must contain to be affected."""
    method: Optional[str] = None


@dataclass
class FakeCluster:
    """In-memory state of one custom resource and its pods."""

    plural: str
    name: str
    spec: Dict[str, Any]
    labels: Dict[str, str]
    status_override: Optional[str] = None
    pod_delay: Optional[float] = None
    worker_pods: Dict[int, float] = field(default_factory=dict)
    """Worker ordinal -> epoch at which it appears in status.nodes."""
    leaving: Dict[int, float] = field(default_factory=dict)
    """Worker ordinal -> epoch at which it disappears."""
    head_created: float = 0.0
    """Epoch of the head pod's creation; it exists from then on."""
    head_ready_at: float = 0.0
    created: float = field(default_factory=time.time)

    @property
    def app(self) -> str:
        return _LAYOUT[self.plural][0]

    @property
    def head_pod(self) -> Optional[str]:
        component = _LAYOUT[self.plural][1]
        return f"{self.name}-{self.app}-{component}-0" if component else None

    def settle(self, now: float) -> None:
        for ordinal, gone in list(self.leaving.items()):
            if gone <= now:
                self.worker_pods.pop(ordinal, None)
                del self.leaving[ordinal]

    def nodes(self, now: float) -> List[str]:
        self.settle(now)
        names = [f"{self.name}-{self.app}-worker-{i}" for i, t in self.worker_pods.items() if t <= now]
        if self.head_pod and self.head_created <= now:
            names.append(self.head_pod)
        return sorted(names)

    def head_ready(self, now: float) -> bool:
        return self.head_pod is not None and self.head_created <= now and self.head_ready_at <= now

    def to_object(self, now: float) -> Dict[str, Any]:
        app, _, crd_kind, _ = _LAYOUT[self.plural]
        status = self.status_override or ("Running" if self.head_ready(now) or not self.head_pod else "Starting")
        return {
            "apiVersion": "distributed-compute.dominodatalab.com/v1alpha1",
            "kind": crd_kind,
            "metadata": {
                "name": self.name,
                "namespace": NAMESPACE,
                "labels": dict(self.labels),
                "creationTimestamp": iso_seconds(self.created),
            },
            "spec": json.loads(json.dumps(self.spec)),
            "status": {
                "clusterStatus": status,
                "nodes": self.nodes(now),
                "workerReplicas": self.spec.get("worker", {}).get("replicas", 0),
                "workerSelector": f"app.kubernetes.io/instance={self.name},"
                f"app.kubernetes.io/component=worker,app.kubernetes.io/name={app}",
                "startTime": iso_seconds(self.created),
                "image": {"repository": f"example/{app}", "tag": "test"},
            },
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_HTTPServer"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without NODELAY, Nagle plus
        # delayed ACKs add ~40 ms to every answer and would distort benchmarks.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self.connection)

    def finish(self) -> None:
        self.server.connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Silence the stdlib's per-request stderr lines."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        owner: ScalerTestServer = self.server.owner
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record = RecordedRequest(
            method=self.command,
            path=split.path,
            query=parse_qs(split.query),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        owner._log(record)
        while not owner._answering.wait(0.05):  # hung: the request was read and is never answered
            if owner._stopping.is_set():
                self.close_connection = True
                return
        fault = owner._take_fault(self.command, split.path)
        if fault is not None and fault.kind == "drop":
            self.close_connection = True
            return
        if fault is not None and fault.kind == "delay":
            if owner._stopping.wait(fault.delay):
                self.close_connection = True
                return
        if fault is not None and fault.kind == "status":
            status, payload, ctype = fault.status, {"error": "upstream", "message": "injected fault"}, "json"
        else:
            status, payload, ctype = owner._route(self.command, split.path, record)
        record.status = status
        data = payload.encode() if ctype == "text" else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if ctype == "text" else "application/json")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True

    def __init__(self, owner: "ScalerTestServer", port: int = 0) -> None:
        self.owner = owner
        self.connections: Set[socket.socket] = set()
        super().__init__(("127.0.0.1", port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Connections the client dropped (timeouts) are expected; keep stderr quiet."""


Response = Tuple[int, Any, str]


class ScalerTestServer:
    """The scaler service, Nucleus tier/principal routes and the API proxy on one local port.

    Credentials known from the start: ``DEFAULT_API_KEY``/``DEFAULT_TOKEN``
    (user ``DEFAULT_USER``, owner of clusters by default), ``ADMIN_API_KEY``
    (an admin) and ``OTHER_API_KEY`` (a user owning nothing). Proxy tokens
    from ``/access-token`` belong to ``proxy_user``.
    """

    def __init__(self, *, token_ttl: float = 300.0, pod_ready_delay: float = 0.0) -> None:
        self.token_ttl = token_ttl
        self.proxy_user = DEFAULT_USER
        self.head_recreate_delay = 0.5
        self.head_ready_delay = 0.5
        self.tiers: List[Dict[str, Any]] = default_tiers()
        self._pod_delay = pod_ready_delay
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._answering = threading.Event()
        self._answering.set()
        self._users: Dict[str, bool] = {DEFAULT_USER: False, ADMIN_USER: True, OTHER_USER: False}
        self._api_keys: Dict[str, str] = {
            DEFAULT_API_KEY: DEFAULT_USER,
            ADMIN_API_KEY: ADMIN_USER,
            OTHER_API_KEY: OTHER_USER,
        }
        self._tokens: Dict[str, str] = {DEFAULT_TOKEN: DEFAULT_USER}
        self._proxy_tokens: Dict[str, Tuple[str, float]] = {}
        self._clusters: Dict[Tuple[str, str], FakeCluster] = {}
        self._faults: List[Fault] = []
        self._requests: List[RecordedRequest] = []
        self._httpd: Optional[_HTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # ----- lifecycle -----

    def start(self, port: int = 0) -> "ScalerTestServer":
        """Listen on ``port`` of 127.0.0.1 (an ephemeral one for 0) in a background thread; a stopped
        server started again on its old port is the service killed and restarted, its clusters kept."""
        self._stopping.clear()
        self._httpd = _HTTPServer(self, port)
        # A short poll interval makes stop() quick; the default 0.5 s adds up over a test suite.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="scaler-test-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, cut open connections and join every server thread."""
        if self._httpd is None:
            return
        self._stopping.set()
        self._httpd.shutdown()
        for conn in list(self._httpd.connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._httpd = None

    def __enter__(self) -> "ScalerTestServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321`` (also the API proxy and Nucleus URL)."""
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # ----- configuration -----

    def add_user(self, user_id: str, *, api_key: Optional[str] = None, token: Optional[str] = None, admin: bool = False) -> None:
        """Register a principal and the credentials that identify it."""
        with self._lock:
            self._users[user_id] = admin
            if api_key:
                self._api_keys[api_key] = user_id
            if token:
                self._tokens[token] = user_id

    def add_cluster(
        self,
        kind: str,
        name: str,
        replicas: int = 1,
        max_replicas: Optional[int] = 4,
        min_replicas: Optional[int] = 1,
        owner: str = DEFAULT_USER,
        *,
        autoscaling: Optional[Dict[str, Any]] = None,
        worker_tier_id: Optional[str] = None,
        head_tier_id: Optional[str] = None,
        cluster_status: Optional[str] = None,
        pod_ready_delay: Optional[float] = None,
    ) -> None:
        """Create a cluster whose ``replicas`` workers and head already exist.

        ``kind`` is short (``ray``) or plural. ``max_replicas=None`` leaves out
        ``spec.autoscaling`` (the service then answers 409 not_scalable) unless
        ``autoscaling`` gives the section verbatim (e.g. without maxReplicas).
        ``cluster_status`` pins ``status.clusterStatus``; ``pod_ready_delay``
        overrides the server-wide delay for this cluster.
        """
        plural = _SHORT_TO_PLURAL.get(kind, kind)
        head_section = _LAYOUT[plural][3]
        spec: Dict[str, Any] = {"worker": {"replicas": replicas, "labels": {}, "resources": {}}}
        if worker_tier_id:
            spec["worker"]["labels"][TIER_LABEL] = worker_tier_id
        if head_section:
            spec[head_section] = {"labels": {TIER_LABEL: head_tier_id} if head_tier_id else {}}
        if autoscaling is not None:
            spec["autoscaling"] = dict(autoscaling)
        elif max_replicas is not None:
            spec["autoscaling"] = {"maxReplicas": max_replicas}
            if min_replicas is not None:
                spec["autoscaling"]["minReplicas"] = min_replicas
        now = time.time()
        cluster = FakeCluster(
            plural=plural,
            name=name,
            spec=spec,
            labels={OWNER_LABEL: owner},
            status_override=cluster_status,
            pod_delay=pod_ready_delay,
            head_created=now - 60,
            head_ready_at=now - 60,
            created=now - 60,
        )
        cluster.worker_pods = {i: now - 60 for i in range(replicas)}
        with self._lock:
            self._clusters[(plural, name)] = cluster

    def remove_cluster(self, kind: str, name: str) -> None:
        """Delete a cluster (later calls see the service's missing-cluster answers)."""
        with self._lock:
            self._clusters.pop((_SHORT_TO_PLURAL.get(kind, kind), name), None)

    def set_pod_ready_delay(self, seconds: float, kind: Optional[str] = None, name: Optional[str] = None) -> None:
        """Seconds before a new worker pod appears in ``status.nodes`` (and before a removed one leaves).

        Without ``kind``/``name`` it applies to every cluster without its own delay.
        """
        with self._lock:
            if kind is None:
                self._pod_delay = seconds
            else:
                self._clusters[(_SHORT_TO_PLURAL.get(kind, kind), str(name))].pod_delay = seconds

    def set_cluster_status(self, kind: str, name: str, status: Optional[str]) -> None:
        """Pin ``status.clusterStatus`` (None: derive it from the head pod)."""
        with self._lock:
            self._clusters[(_SHORT_TO_PLURAL.get(kind, kind), name)].status_override = status

    def cluster_object(self, kind: str, name: str) -> Dict[str, Any]:
        """The custom object as the service would return it now."""
        with self._lock:
            return self._clusters[(_SHORT_TO_PLURAL.get(kind, kind), name)].to_object(time.time())

    def expire_tokens(self) -> None:
        """Make every proxy token issued so far expired."""
        with self._lock:
            self._proxy_tokens = {t: (u, 0.0) for t, (u, _) in self._proxy_tokens.items()}

    def inject_faults(
        self,
        kind: str = "status",
        count: int = 1,
        *,
        status: int = 503,
        delay: float = 0.0,
        path: str = "/ddl_cluster_scaler/",
        method: Optional[str] = None,
    ) -> None:
        """Misbehave on the next ``count`` requests whose path contains ``path``.

        ``kind``: ``status`` answers ``status`` (e.g. 502/503/504) without doing
        anything; ``drop`` closes the connection without answering; ``delay``
        waits ``delay`` seconds and then answers normally.
        """
        if kind not in ("status", "drop", "delay"):
            raise ValueError(f"unknown fault kind {kind!r}")
        with self._lock:
            self._faults.append(Fault(kind, count, status, delay, path, method))

    def hang(self) -> None:
        """From now on accept connections and read requests, but answer none (until :meth:`resume`)."""
        self._answering.clear()

    def resume(self) -> None:
        """Answer again, the requests held by :meth:`hang` first."""
        self._answering.set()

    @property
    def port(self) -> int:
        """The port it listens on."""
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    def clear_faults(self) -> None:
        """Forget injected faults that have not fired yet."""
        with self._lock:
            self._faults.clear()

    # ----- request log -----

    @property
    def requests(self) -> List[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    def count(self, method: Optional[str] = None, path_contains: str = "") -> int:
        """How many requests matched ``method`` (any when None) and contained ``path_contains``."""
        return sum(
            1 for r in self.requests if (method is None or r.method == method) and path_contains in r.path
        )

    def clear_requests(self) -> None:
        """Empty the request log."""
        with self._lock:
            self._requests.clear()

    def _log(self, record: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(record)

    def _take_fault(self, method: str, path: str) -> Optional[Fault]:
        with self._lock:
            for fault in self._faults:
                if fault.count > 0 and fault.path in path and (fault.method in (None, method)):
                    fault.count -= 1
                    return fault
        return None

    # ----- auth -----

    def _caller(self, headers: Dict[str, str]) -> Optional[Tuple[str, bool]]:
        """``(user, admin)`` for the request's credentials, None for anonymous.

        Like the service, an API key wins over a bearer token when both are sent.
        """
        with self._lock:
            key = headers.get("x-domino-api-key")
            if key:
                user = self._api_keys.get(key)
            else:
                auth = headers.get("authorization", "")
                token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
                user = self._tokens.get(token)
                if user is None and token in self._proxy_tokens:
                    owner, expires = self._proxy_tokens[token]
                    user = owner if time.time() < expires else None
            return (user, self._users.get(user, False)) if user else None

    @staticmethod
    def _allowed(caller: Optional[Tuple[str, bool]], cluster: FakeCluster) -> bool:
        if caller is None:
            return False
        user, admin = caller
        return admin or cluster.labels.get(OWNER_LABEL) == user

    # ----- routes -----

    def _route(self, method: str, path: str, req: RecordedRequest) -> Response:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        with self._lock:
            if method == "GET" and path == "/healthz":
                return 200, {"status": "healthy"}, "json"
            if method == "GET" and path == "/access-token":
                token = "proxy-" + secrets.token_hex(16)
                self._proxy_tokens[token] = (self.proxy_user, time.time() + self.token_ttl)
                return 200, token, "text"
            if method == "GET" and path == "/v4/hardwareTier":
                if self._caller(req.headers) is None:
                    return 401, {"message": "Unauthorized"}, "json"
                return 200, {"hardwareTiers": json.loads(json.dumps(self.tiers))}, "json"
            if method == "GET" and path == "/v4/auth/principal":
                caller = self._caller(req.headers)
                if caller is None:
                    return 401, {"message": "Unauthorized"}, "json"
                return 200, {"canonicalId": caller[0], "canonicalName": caller[0], "isAdmin": caller[1], "isAnonymous": False}, "json"
            if len(parts) >= 3 and parts[0] == "ddl_cluster_scaler":
                handler = {
                    ("GET", "list", 3): self._list,
                    ("GET", "cluster", 4): self._get,
                    ("PATCH", "scale", 4): self._scale,
                    ("PATCH", "restart_head", 4): self._restart,
                    ("GET", "restart_head_status", 4): self._restart_status,
                }.get((method, parts[1], len(parts)))
                if handler is not None:
                    return handler(req, *parts[2:])
                if any(parts[1] == route for route in ("list", "cluster", "scale", "restart_head", "restart_head_status")):
                    return 405, {"error": "method_not_allowed"}, "json"
            return 404, {"error": "not_found"}, "json"

    @staticmethod
    def _invalid_kind() -> Response:
        return 400, {"error": "invalid_kind", "message": f"kind must be one of {sorted(SERVED_KINDS)}"}, "json"

    def _list(self, req: RecordedRequest, kind: str) -> Response:
        if kind not in SERVED_KINDS:
            return self._invalid_kind()
        caller = self._caller(req.headers)
        now = time.time()
        visible = [c.to_object(now) for (p, _), c in sorted(self._clusters.items()) if p == kind and self._allowed(caller, c)]
        return 200, {"kind": kind, "count": len(visible), "clusters": visible}, "json"

    def _missing(self, code: str, verb: str, name: str, plural: str) -> Response:
        details = _api_exception_text(404, "NotFound", name, f"{plural}.distributed-compute.dominodatalab.com")
        return 500, {"error": code, "message": f"Failed to {verb} cluster {name}", "details": details}, "json"

    def _get(self, req: RecordedRequest, kind: str, name: str) -> Response:
        if kind not in SERVED_KINDS:
            return self._invalid_kind()
        cluster = self._clusters.get((kind, name))
        if cluster is None:
            return self._missing("get_failed", "fetch", name, kind)
        if not self._allowed(self._caller(req.headers), cluster):
            return 403, {"error": "unauthorized", "message": f"Not authorized to access cluster {name}"}, "json"
        return 200, cluster.to_object(time.time()), "json"

    def _scale(self, req: RecordedRequest, kind: str, name: str) -> Response:
        if kind not in SERVED_KINDS:
            return self._invalid_kind()
        payload = req.body if isinstance(req.body, dict) else {}
        try:
            requested = int(payload.get("replicas"))  # the service's own parsing
            if requested < 0:
                raise ValueError(requested)
        except (TypeError, ValueError):
            return 400, {"error": "bad_request", "message": "replicas must be a non-negative integer"}, "json"
        cluster = self._clusters.get((kind, name))
        if cluster is None:
            return self._missing("scale_failed", "scale", name, kind)
        if not self._allowed(self._caller(req.headers), cluster):
            return 403, {"error": "unauthorized", "message": f"Not authorized to update cluster {name}"}, "json"
        autoscaling = cluster.spec.get("autoscaling")
        if not isinstance(autoscaling, dict):
            return 409, {"error": "not_scalable", "message": "Cannot scale this cluster: autoscaling not enabled"}, "json"
        try:
            max_replicas = int(autoscaling.get("maxReplicas"))
        except (TypeError, ValueError):
            return 409, {"error": "invalid_autoscaling", "message": "autoscaling.maxReplicas is missing or invalid"}, "json"
        tier_name = payload.get("worker_hw_tier_name")
        tier: Optional[Dict[str, Any]] = None
        if tier_name:
            tier = next((t for t in self.tiers if t.get("name") == tier_name), None)
            if tier is None:
                return 400, {"error": "invalid_hw_tier", "message": f"Hardware tier not found: {tier_name}"}, "json"
            flags = {
                "sparkclusters": tier["computeClusterRestrictions"].get("restrictToSpark", False),
                "rayclusters": tier["computeClusterRestrictions"].get("restrictToRay", False),
                "daskclusters": tier["computeClusterRestrictions"].get("restrictToDask", False),
                "mpiclusters": tier["computeClusterRestrictions"].get("restrictToMpi", False),
            }
            if any(flags.values()) and not flags[kind]:
                allowed = [k for k, v in flags.items() if v]
                return 400, {"error": "invalid_hw_tier", "message": f"Hardware tier '{tier_name}' is restricted to {allowed}"}, "json"
        effective = min(requested, max_replicas)
        self._apply_scale(cluster, effective, tier)
        return 200, {
            "kind": kind,
            "name": name,
            "requested_replicas": requested,
            "effective_replicas": effective,
            "maxReplicas": max_replicas,
            "capped": requested > max_replicas,
            "worker_hw_tier_id": json.loads(json.dumps(tier)) if tier else None,
            "object": cluster.to_object(time.time()),
        }, "json"

    def _apply_scale(self, cluster: FakeCluster, replicas: int, tier: Optional[Dict[str, Any]]) -> None:
        now = time.time()
        delay = cluster.pod_delay if cluster.pod_delay is not None else self._pod_delay
        cluster.settle(now)
        worker = cluster.spec.setdefault("worker", {})
        worker["replicas"] = replicas
        for ordinal in range(replicas):
            cluster.leaving.pop(ordinal, None)
            cluster.worker_pods.setdefault(ordinal, now + delay)
        for ordinal in list(cluster.worker_pods):
            if ordinal >= replicas:
                cluster.leaving.setdefault(ordinal, now + delay)
        if tier is not None:
            res = tier.get("hwtResources") or {}

            def qty(mem: Optional[Dict[str, Any]]) -> Optional[str]:
                return f"{mem['value']}{str(mem['unit'])[:2]}" if mem else None

            worker.setdefault("labels", {})[TIER_LABEL] = tier["id"]
            worker.setdefault("nodeSelector", {})[NODE_POOL] = tier.get("nodePool")
            requests = {"cpu": str(res.get("cores")), "memory": qty(res.get("memory"))}
            limits = {"cpu": str(res.get("coresLimit")), "memory": qty(res.get("memoryLimit"))}
            gpus = (tier.get("gpuConfiguration") or {}).get("numberOfGpus")
            if isinstance(gpus, int):
                requests["nvidia.com/gpu"] = gpus
                limits["nvidia.com/gpu"] = gpus
            worker["resources"] = {"requests": requests, "limits": limits}

    def _head_target(self, kind: str, name: str) -> Tuple[str, Optional[FakeCluster]]:
        """The pod the service addresses (its defect: ``<name>-<prefix>-head-0``) and the cluster owning it."""
        prefix = kind[: -len("clusters")] if kind.endswith("clusters") else kind
        pod = f"{name}-{prefix}-head-0"
        for cluster in self._clusters.values():
            if cluster.head_pod == pod and cluster.name == name:
                return pod, cluster
        return pod, None

    def _restart(self, req: RecordedRequest, kind: str, name: str) -> Response:
        pod, cluster = self._head_target(kind, name)
        now = time.time()
        if cluster is None or cluster.head_created > now:
            return 404, {"ok": False, "error": "NotFound", "namespace": NAMESPACE, "pod": pod}, "json"
        if not self._allowed(self._caller(req.headers), cluster):
            return 403, {"error": "unauthorized", "message": f"Not authorized to update cluster {name}"}, "json"
        # The StatefulSet recreates the pod with the same name and a newer creationTimestamp.
        cluster.head_created = now + self.head_recreate_delay
        cluster.head_ready_at = cluster.head_created + self.head_ready_delay
        return 202, {
            "ok": True,
            "namespace": NAMESPACE,
            "pod": pod,
            "grace_period_seconds": 20,
            "started_at": iso_seconds(now),
            "k8s_response": {"kind": "Pod", "metadata": {"name": pod, "namespace": NAMESPACE}},
        }, "json"

    def _restart_status(self, req: RecordedRequest, kind: str, name: str) -> Response:
        raw = (req.query.get("started_at") or [None])[0]
        started = _parse_iso(raw)
        if started is None:
            return 400, {"error": "bad_request", "message": "started_at (ISO-8601) is required"}, "json"
        pod, cluster = self._head_target(kind, name)
        now = time.time()
        if cluster is None or cluster.head_created > now:
            return 404, {"ok": False, "status": "head_pod_not_found", "pod": pod}, "json"
        if not self._allowed(self._caller(req.headers), cluster):
            return 403, {"error": "unauthorized", "message": f"Not authorized to access cluster {name}"}, "json"
        created = datetime.datetime.fromtimestamp(int(cluster.head_created), datetime.timezone.utc)
        restarted = created >= started
        ready = cluster.head_ready(now)
        if not restarted:
            state = "not_restarted"
        elif not ready:
            state = "restarted_but_not_ready"
        else:
            state = "restarted_and_ready"
        return 200, {
            "ok": restarted and ready,
            "restarted": restarted,
            "ready": ready,
            "status": state,
            "pod": pod,
            "creationTimestamp": iso_seconds(cluster.head_created),
            "started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }, "json"
