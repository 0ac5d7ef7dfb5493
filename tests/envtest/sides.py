"""One Kubernetes contract, two API servers: the repository's test server and a real kube-apiserver.

A contract test takes a :class:`Side` and only uses what both offer: create a
DCO cluster and wait for its pods, read the object and the pods, slow new
pods down, open a backend as the admin or as the non-admin user, grant the
user a shipped Role, and send raw requests with an admin API client. The
same test body then runs against :class:`TestServerSide`
(``tests/servers/k8s_server.py``, its simulated operator) and
:class:`RealServerSide` (the envtest tier's control plane, the DCO stand-in
and the fake kubelet), and where the two answer differently the test fails.
"""
import contextlib
import json
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION, LABEL_APP, LABEL_COMPONENT, LABEL_INSTANCE, LAYOUTS
from flytekitplugins_ddlscale.backends.tiers import FileTierCatalog

from tests.servers.k8s_fixtures import role_rules
from tests.servers.k8s_server import K8sTestServer, cluster_object, pod_ready

WAIT = 30.0
"""Seconds a side waits for a new cluster's pods before failing the test."""


class Side:
    """What a contract test may do on an API server (see the module docstring)."""

    name: str
    namespace: str

    def __init__(self, tiers: Path) -> None:
        self.tiers = tiers

    # -- to implement ------------------------------------------------------
    def _create(self, kind: str, obj: Dict[str, Any]) -> None:
        raise NotImplementedError

    def get_object(self, kind: str, name: str) -> Dict[str, Any]:
        """The cluster object as stored now."""
        raise NotImplementedError

    def pods(self, name: str, component: Optional[str] = None, kind: Optional[str] = None) -> List[Dict[str, Any]]:
        """The cluster's pods (of one component, of one kind's app), sorted by name."""
        raise NotImplementedError

    def set_ready_delay(self, seconds: float, cluster: Optional[str] = None) -> None:
        """How long new pods (of one cluster, or all) take to become Ready."""
        raise NotImplementedError

    def admin_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` with every right; the side closes it."""
        raise NotImplementedError

    def grant(self, role_file: Path, without: Optional[Tuple[str, str]] = None) -> None:
        """Give the non-admin user the Role (and RoleBinding) of ``role_file``, in :attr:`namespace`, less
        the permission ``without`` = ``(verb, resource)`` when given."""
        raise NotImplementedError

    def _client_source(self, user: bool) -> Dict[str, Any]:
        raise NotImplementedError

    def compact(self) -> None:
        """Forget the watch history: watches from any version handed out so far get 410 Gone."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the side made."""

    # -- shared ------------------------------------------------------------
    def add_cluster(self, kind: str, name: str, *, wait_ready: bool = True, **options: Any) -> None:
        """Create a DCO cluster object (see ``cluster_object``) and, by default, wait for its pods to be Ready."""
        obj = cluster_object(kind, name, self.namespace, **options)
        self._create(kind, obj)
        if wait_ready:
            replicas = obj["spec"]["worker"]["replicas"]
            self.wait_for(lambda: self.ready_workers(name, kind) == replicas
                          and (LAYOUTS[kind].head_section is None or self.head_ready(name, kind)),
                          f"cluster {kind}/{name} to come up with {replicas} Ready workers")

    def ready_workers(self, name: str, kind: Optional[str] = None) -> int:
        """Worker pods that are Ready and not terminating."""
        return sum(1 for p in self.pods(name, "worker", kind) if pod_ready(p))

    def head_ready(self, name: str, kind: Optional[str] = None) -> bool:
        return any(pod_ready(p) for p in self.pods(name, None, kind)
                   if p["metadata"]["labels"][LABEL_COMPONENT] != "worker")

    def wait_for(self, predicate: Any, what: str, timeout: float = WAIT) -> None:
        """Poll ``predicate`` until it holds; AssertionError naming ``what`` after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > end:
                raise AssertionError(f"{self.name}: timed out after {timeout} s waiting for {what}")
            time.sleep(0.02)

    @contextlib.contextmanager
    def backend(self, user: bool = False, **options: Any) -> Iterator[KubernetesBackend]:
        """A backend as the admin (or the non-admin user) with the test tiers; closed on exit."""
        options.setdefault("failure_grace", 0.3)
        instance = KubernetesBackend(tier_catalog=FileTierCatalog(self.tiers), **self._client_source(user), **options)
        try:
            yield instance
        finally:
            instance.close()


class TestServerSide(Side):
    """The repository's Kubernetes test server (one per test), in namespace ``domino-compute``.

    The test server has one user and no RBAC of its own: the non-admin user
    is played with ``allow_only`` (the granted Roles' rules, none at first).
    """

    name = "test-server"
    __test__ = False

    def __init__(self, tiers: Path) -> None:
        super().__init__(tiers)
        self.namespace = "domino-compute"
        self.server = K8sTestServer(ready_delay=0.02).start()
        self._granted: Set[Tuple[str, str]] = set()
        self._clients: List[Any] = []

    def _create(self, kind: str, obj: Dict[str, Any]) -> None:
        with self.server.lock:
            self.server._create(LAYOUTS[kind].plural, self.namespace, obj)

    def get_object(self, kind: str, name: str) -> Dict[str, Any]:
        return self.server.get_object(kind, name, self.namespace)

    def pods(self, name: str, component: Optional[str] = None, kind: Optional[str] = None) -> List[Dict[str, Any]]:
        return self.server.pods(name, self.namespace, component, kind)

    def set_ready_delay(self, seconds: float, cluster: Optional[str] = None) -> None:
        self.server.set_ready_delay(seconds, cluster)

    def admin_client(self) -> Any:
        self._clients.append(self.server.api_client())
        return self._clients[-1]

    def compact(self) -> None:
        self.server.compact()

    def grant(self, role_file: Path, without: Optional[Tuple[str, str]] = None) -> None:
        self._granted |= role_rules(role_file) - {without}
        if self.server._allowed is not None:
            self.server.allow_only(self._granted)

    def _client_source(self, user: bool) -> Dict[str, Any]:
        if user:
            self.server.allow_only(self._granted)
        self._clients.append(self.server.api_client())
        return {"api_client": self._clients[-1]}

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self.server.close()


class RealServerSide(Side):
    """The envtest tier's real kube-apiserver, in a fresh namespace per test."""

    name = "api-server"

    def __init__(self, tiers: Path, envtest: Any) -> None:
        from kubernetes import client

        super().__init__(tiers)
        self.envtest = envtest
        self.namespace = envtest.new_namespace()
        self.custom = client.CustomObjectsApi(envtest.admin)
        self.core = client.CoreV1Api(envtest.admin)

    def _create(self, kind: str, obj: Dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(CRD_GROUP, CRD_VERSION, self.namespace, LAYOUTS[kind].plural, obj)

    def get_object(self, kind: str, name: str) -> Dict[str, Any]:
        return self.custom.get_namespaced_custom_object(
            CRD_GROUP, CRD_VERSION, self.namespace, LAYOUTS[kind].plural, name)

    def pods(self, name: str, component: Optional[str] = None, kind: Optional[str] = None) -> List[Dict[str, Any]]:
        selector = [f"{LABEL_INSTANCE}={name}"]
        if component:
            selector.append(f"{LABEL_COMPONENT}={component}")
        if kind:
            selector.append(f"{LABEL_APP}={LAYOUTS[kind].app}")
        answer = self.core.list_namespaced_pod(
            self.namespace, label_selector=",".join(selector), _preload_content=False)
        return sorted(json.loads(answer.data)["items"], key=lambda p: p["metadata"]["name"])

    def set_ready_delay(self, seconds: float, cluster: Optional[str] = None) -> None:
        self.envtest.kubelet.set_ready_delay(seconds, cluster)

    def admin_client(self) -> Any:
        return self.envtest.admin

    def compact(self) -> None:
        self.envtest.plane.compact()

    def grant(self, role_file: Path, without: Optional[Tuple[str, str]] = None) -> None:
        self.envtest.grant(role_file, self.namespace, without)

    def _client_source(self, user: bool) -> Dict[str, Any]:
        plane = self.envtest.plane
        return {"kubeconfig": str(plane.user_kubeconfig if user else plane.admin_kubeconfig)}

    def close(self) -> None:
        from .running import READY_DELAY

        kubelet = self.envtest.kubelet
        kubelet.delays.clear()
        kubelet.set_ready_delay(READY_DELAY)
        # The namespace controller removes the namespace and everything in it in the background.
        self.core.delete_namespace(self.namespace)
