"""In a pod, the Kubernetes backend calls the API server with its service account's token, a file the kubelet
replaces as the token nears its expiry. A backend held open across calls, as the connector holds it, sends the
token the file holds at each request: on the real kube-apiserver, with real service-account tokens (TokenRequest),
the first one revoked once the file holds the second."""
import contextlib
import secrets
import time
import urllib.error
import urllib.request
import ssl

import pytest

from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
from flytekitplugins_ddlscale.backends.tiers import FileTierCatalog
from flytekitplugins_ddlscale.refs import ClusterRef
from tests.envtest.sides import RealServerSide
from tests.envtest.test_envtest_manifests import _await_binding, _bind_as_the_manifest_does, _manifest_object
from tests.servers.k8s_fixtures import tiers_file  # noqa: F401 - fixture
from tests.test_connector_scaler_deployment import kubelet_writes

pytestmark = pytest.mark.envtest
REVOKED_WITHIN = 30.0
"""Seconds the API server gets to refuse a token whose bound object was deleted."""


@contextlib.contextmanager
def _service_account(envtest):
    """The connector Deployment's service account (examples/k8s/connector.yaml), created for the block and deleted
    after it (the session's control plane dry-runs the manifest, which creates it): (namespace, name)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    deployment = _manifest_object("connector.yaml", "Deployment")
    namespace, name = deployment["metadata"]["namespace"], deployment["spec"]["template"]["spec"]["serviceAccountName"]
    core = client.CoreV1Api(envtest.admin)
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except ApiException as error:
        if error.status != 409:  # the control plane is shared by the session
            raise
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    try:
        yield namespace, name
    finally:
        core.delete_namespaced_service_account(name, namespace)


def _token(envtest, account):
    """A token of ``account`` from the TokenRequest API, bound to a Secret of its own: (token, the Secret's name)."""
    from kubernetes import client

    namespace, name = account
    core = client.CoreV1Api(envtest.admin)
    bound = core.create_namespaced_secret(namespace, {"metadata": {"name": f"bound-{secrets.token_hex(4)}"}})
    answer = core.create_namespaced_service_account_token(name, namespace, {"spec": {
        "expirationSeconds": 3600,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": bound.metadata.name, "uid": bound.metadata.uid},
    }})
    return answer.status.token, bound.metadata.name


def _refused(envtest, token):
    """Whether the API server answers a request carrying ``token`` with 401."""
    context = ssl.create_default_context(cafile=str(envtest.plane.work / "certs" / "ca.crt"))
    request = urllib.request.Request(f"{envtest.plane.url}/api", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5, context=context):
            return False
    except urllib.error.HTTPError as error:
        return error.code == 401


def test_a_backend_held_open_sends_the_service_account_token_the_kubelet_rotated(envtest, tiers_file, tmp_path,
                                                                               monkeypatch):  # noqa: F811
    from kubernetes import client
    from kubernetes.config import incluster_config

    side = RealServerSide(tiers_file, envtest)
    with contextlib.ExitStack() as stack:
        stack.callback(side.close)
        side.add_cluster("ray", "c1", replicas=1)
        account = stack.enter_context(_service_account(envtest))
        role = _bind_as_the_manifest_does(envtest, "rbac.yaml", "connector.yaml", side.namespace)
        _await_binding(envtest, f"system:serviceaccount:{account[0]}:{account[1]}", side.namespace, role)
        (first, first_bound), (second, _) = _token(envtest, account), _token(envtest, account)
        # The pod's view: the service's address in the environment, the token and CA where the kubelet mounts them.
        folder = tmp_path / "serviceaccount"
        kubelet_writes(folder, first, 1)
        monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(folder / "token"))
        monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(envtest.plane.work / "certs" / "ca.crt"))
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(envtest.plane.port))
        monkeypatch.delenv("KUBECONFIG", raising=False)

        ref = ClusterRef("ray", "c1", side.namespace)
        with KubernetesBackend(namespace=side.namespace, tier_catalog=FileTierCatalog(tiers_file),
                               failure_grace=0.3) as backend:
            assert backend.scale(ref, 2, timeout=60).final.ready_workers == 2
            kubelet_writes(folder, second, 2)
            client.CoreV1Api(envtest.admin).delete_namespaced_secret(first_bound, account[0])
            deadline = time.monotonic() + REVOKED_WITHIN
            while not _refused(envtest, first):
                assert time.monotonic() < deadline, f"the first token was still accepted after {REVOKED_WITHIN:g} s"
                time.sleep(0.2)
            assert backend.restore_baseline(ref, timeout=60).final.ready_workers == 1
        assert side.get_object("ray", "c1")["spec"]["worker"]["replicas"] == 1
