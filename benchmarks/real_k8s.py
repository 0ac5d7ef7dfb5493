"""The benchmarks' real Kubernetes API server: the envtest tier's control plane, with the moments benchmarks need.

``k8s_lag`` and ``fleet_k8s`` take a choice of server: the Kubernetes test
server (:func:`benchmarks.servers.timed_k8s_server`) or, here, a real
kube-apiserver with etcd and kube-controller-manager started exactly as the
envtest tier starts them (``tests/envtest/running.start_envtest``: the CRDs,
the DCO webhook, the fake kubelet, the DCO stand-in). Differences from the
tier's: the pod watch cache is on, as on a real cluster (the tier turns it
off to stage 410s), and the benchmark's client is the non-admin user bound to
the shipped Role (``examples/k8s/rbac.yaml``), so RBAC decides every request.

:class:`RealK8sServer` offers what the benchmarks read from the test server,
for one namespace of the plane:

- Ready moments: the fake kubelet's ``time.time()`` just before it sent a
  pod's Ready status (same clock as the client's return), so lag includes
  that write's trip through the API server and etcd and the watch event's
  way back, which is what the real server adds;
- requests and open watches of the client: read from the API server's audit
  log, which records the non-admin user's requests only
  (``ControlPlane.audit_log``).

Without ``$DDLSCALE_ENVTEST_DIR`` (or etcd) :func:`missing` says what to set
and the benchmark reports itself skipped.
"""
import contextlib
import datetime
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import parse_qsl

from tests.envtest.controlplane import ENV_DIR, missing_requirements
from tests.envtest.running import Envtest, start_envtest

RBAC = Path(__file__).resolve().parents[1] / "examples" / "k8s" / "rbac.yaml"
GONE_TIMEOUT = 600.0
"""Seconds a namespace may take to be deleted with everything in it, before :meth:`RealK8sServer.close` gives up."""
UP_TIMEOUT = 600.0
"""Seconds new clusters may take to come up with Ready workers."""
_METHODS = {"get": "GET", "list": "GET", "watch": "GET", "patch": "PATCH", "update": "PUT", "create": "POST",
            "delete": "DELETE", "deletecollection": "DELETE"}
_lent: List[Envtest] = []


def missing() -> str:
    """Why the real API server cannot run here, with what to set (empty when it can)."""
    reasons = missing_requirements()
    if not reasons:
        return ""
    return f"real kube-apiserver not started: {'; '.join(reasons)} (set {ENV_DIR}=/path/to/envtest, docs/envtest.md)"


@contextlib.contextmanager
def lend(envtest: Envtest) -> Iterator[None]:
    """Within the block, benchmarks use ``envtest`` (an already running control plane, e.g. the test tier's
    session one) instead of starting their own: how the smoke test avoids a second start."""
    _lent.append(envtest)
    try:
        yield
    finally:
        _lent.remove(envtest)


@contextlib.contextmanager
def control_plane() -> Iterator[Envtest]:
    """A running control plane for one benchmark: a lent one, else one started here (pod watch cache on)."""
    if _lent:
        yield _lent[-1]
        return
    with start_envtest(Path(os.environ[ENV_DIR]), pod_watch_cache=True) as running:
        yield running


@dataclass
class AuditedRequest:
    """One request of the benchmark's client as the audit log has it (the test server's request log fields)."""

    method: str
    path: str
    query: Dict[str, str] = field(default_factory=dict)
    status: int = 0
    """The API server's answer (a watch's once it started streaming)."""


def _stamp(text: str) -> float:
    """Seconds since the epoch of an audit timestamp (RFC 3339, microseconds)."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class RealK8sServer:
    """One namespace of a running control plane, the client user granted the shipped Role in it.

    Offers the test server's benchmark surface: ``add_cluster``,
    ``set_ready_delay``, ``ready_moments``, ``ready_moments_all``,
    ``clear_log``, ``requests``, ``peak_watches``, ``peak_watches_per_resource``, ``api_client``, ``url``.
    """

    def __init__(self, envtest: Envtest, namespace: str) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        self.envtest = envtest
        self.namespace = namespace
        self.url = envtest.plane.url
        self.kubeconfig = envtest.plane.user_kubeconfig
        self.http_auth = {"token": envtest.plane.user_token, "ca": str(envtest.plane.work / "certs" / "ca.crt")}
        """What a plain HTTP client needs to be this user (token, CA file)."""
        self._custom = client.CustomObjectsApi(envtest.admin)
        self._core = client.CoreV1Api(envtest.admin)
        try:
            self._core.create_namespace({"metadata": {"name": namespace}})
        except ApiException as error:
            if error.status != 409:  # already there: the envtest control plane is shared by a test session
                raise
        envtest.grant(RBAC, namespace)
        self._clusters: List[str] = []
        self._lock = threading.Lock()
        self._ready_at: Dict[str, Tuple[float, Optional[float], str, str]] = {}
        self._log_from = 0
        envtest.kubelet.ready_listeners.append(self._on_ready)

    # -- the cluster objects -----------------------------------------------
    def add_cluster(self, kind: str, name: str, namespace: Optional[str] = None, **options: Any) -> None:
        """Create a DCO cluster object (``tests.servers.k8s_server.cluster_object`` options) as the admin;
        ``wait_ready`` is accepted and ignored (see :meth:`wait_up`)."""
        from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION, LAYOUTS
        from tests.servers.k8s_server import cluster_object

        options.pop("wait_ready", None)
        body = cluster_object(kind, name, self.namespace, **options)
        self._custom.create_namespaced_custom_object(CRD_GROUP, CRD_VERSION, self.namespace, LAYOUTS[kind].plural, body)
        self._clusters.append(name)

    def wait_up(self, workers: int, timeout: float = UP_TIMEOUT) -> None:
        """Until ``workers`` worker pods of this namespace have been made Ready; RuntimeError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while len(self.ready_moments_all("worker")) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {workers} Ready workers in "
                                   f"{self.namespace} (kubelet: {self.envtest.kubelet.errors}, "
                                   f"DCO stand-in: {self.envtest.operator.errors})")
            time.sleep(0.2)

    def set_ready_delay(self, seconds: float, cluster: Optional[str] = None) -> None:
        """How long new pods of ``cluster`` (or of every cluster made here) take to become Ready."""
        # Per cluster, never the kubelet's default: a lent control plane serves other namespaces too.
        for name in [cluster] if cluster else list(self._clusters):
            self.envtest.kubelet.set_ready_delay(seconds, name)

    # -- Ready moments -----------------------------------------------------
    def _on_ready(self, pod: Dict[str, Any], sent: float, accepted: Optional[float]) -> None:
        meta = pod["metadata"]
        if meta["namespace"] != self.namespace:
            return
        labels = meta.get("labels") or {}
        with self._lock:
            if accepted is None:
                self._ready_at.setdefault(meta["uid"], (sent, None, labels.get("app.kubernetes.io/instance", ""),
                                                        labels.get("app.kubernetes.io/component", "")))
            elif meta["uid"] in self._ready_at:
                self._ready_at[meta["uid"]] = (sent, accepted) + self._ready_at[meta["uid"]][2:]

    def ready_moments(self, cluster: str, component: str = "worker", since: float = 0.0) -> List[float]:
        """When pods of ``cluster``/``component`` were made Ready (the status write sent), for those after ``since``."""
        with self._lock:
            return sorted(t for t, _, c, comp in self._ready_at.values()
                          if c == cluster and comp == component and t >= since)

    def accepted_moments(self, cluster: str, component: str = "worker", since: float = 0.0) -> List[float]:
        """When the API server accepted the Ready writes of :meth:`ready_moments` (the kubelet got the answer);
        a write not yet answered counts from when it was sent."""
        with self._lock:
            return sorted(done if done is not None else t for t, done, c, comp in self._ready_at.values()
                          if c == cluster and comp == component and t >= since)

    def ready_moments_all(self, component: str = "worker") -> List[float]:
        """When each pod of ``component`` (any cluster here) was made Ready."""
        with self._lock:
            return sorted(t for t, _, _, comp in self._ready_at.values() if comp == component)

    def ready_write_ms(self, since: float = 0.0) -> List[float]:
        """Round trips of the kubelet's Ready status writes (sent to accepted) after ``since``, in ms."""
        with self._lock:
            return sorted((done - sent) * 1000.0 for sent, done, _, _ in self._ready_at.values()
                          if sent >= since and done is not None)

    # -- the client's requests (audit log) ---------------------------------
    def _events(self) -> List[Dict[str, Any]]:
        found = []
        try:
            lines = self.envtest.plane.audit_log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return found
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:  # a line being written right now
                continue
            if (event.get("objectRef") or {}).get("namespace") == self.namespace:
                found.append(event)
        return found

    def clear_log(self) -> None:
        """Count requests from now on."""
        self._log_from = len(self._events())

    @property
    def requests(self) -> List[AuditedRequest]:
        """The client's requests in this namespace since :meth:`clear_log`, each once (a watch still open
        has no ResponseComplete event yet: it counts from its ResponseStarted)."""
        events = self._events()
        out, seen = [], {e.get("auditID") for e in events[:self._log_from]}
        for event in events[self._log_from:]:
            if event.get("auditID") in seen:
                continue
            seen.add(event.get("auditID"))
            path, _, query = event.get("requestURI", "").partition("?")
            fields = dict(parse_qsl(query))
            if event.get("verb") == "watch":
                fields["watch"] = "true"
            status = int((event.get("responseStatus") or {}).get("code") or 0)
            out.append(AuditedRequest(_METHODS.get(event.get("verb", ""), event.get("verb", "")), path, fields, status))
        return out

    def server_ms(self) -> Dict[str, Dict[str, float]]:
        """Time the API server spent on each kind of the client's requests since :meth:`clear_log` (received to
        answered, from the audit log; watches left out), per ``"<verb> <resource>"``, in ms."""
        from benchmarks.stats import summarize

        spent: Dict[str, List[float]] = {}
        for event in self._events()[self._log_from:]:
            if event.get("stage") != "ResponseComplete" or event.get("verb") == "watch":
                continue
            took = _stamp(event["stageTimestamp"]) - _stamp(event["requestReceivedTimestamp"])
            key = f"{event.get('verb')} {(event.get('objectRef') or {}).get('resource', '')}"
            spent.setdefault(key, []).append(took * 1000.0)
        return {key: summarize(values, 2) for key, values in sorted(spent.items())}

    @property
    def peak_watches(self) -> int:
        """The most watches the client had open at once in this namespace."""
        return self._peak_watches(lambda event: "")

    @property
    def peak_watches_per_resource(self) -> int:
        """The most watches the client had open at once on one resource (pods, rayclusters...) of this namespace."""
        return self._peak_watches(lambda event: str((event.get("objectRef") or {}).get("resource", "")))

    def _peak_watches(self, group: Any) -> int:
        events = sorted((e for e in self._events() if e.get("verb") == "watch"),
                        key=lambda e: (e.get("stageTimestamp", ""), e.get("stage") == "ResponseStarted"))
        open_now: Dict[str, int] = {}
        peak = 0
        started = set()
        for event in events:
            key = group(event)
            if event.get("stage") == "ResponseStarted":
                started.add(event.get("auditID"))
                open_now[key] = open_now.get(key, 0) + 1
                peak = max(peak, open_now[key])
            elif event.get("stage") == "ResponseComplete" and event.get("auditID") in started:
                open_now[key] -= 1
        return peak

    # -- clients -----------------------------------------------------------
    def api_client(self, pool_size: int = 16) -> Any:
        """A ``kubernetes.client.ApiClient`` as the client user; the caller closes it."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = pool_size
        return client.ApiClient(configuration)

    def close(self) -> None:
        """Stop recording, and delete the namespace with everything in it (waits until it is gone)."""
        from kubernetes.client.exceptions import ApiException

        kubelet = self.envtest.kubelet
        if self._on_ready in kubelet.ready_listeners:
            kubelet.ready_listeners.remove(self._on_ready)
        for name in self._clusters:
            kubelet.delays.pop(name, None)
        self._core.delete_namespace(self.namespace)
        deadline = time.monotonic() + GONE_TIMEOUT
        while time.monotonic() < deadline:
            try:
                self._core.read_namespace(self.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            time.sleep(0.5)
        raise RuntimeError(f"namespace {self.namespace} still there {GONE_TIMEOUT:.0f} s after its deletion")
