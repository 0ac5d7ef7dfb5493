"""Every document under examples/k8s/ is accepted by the real kube-apiserver, and each Role file's binding of the
connectors gives their service accounts exactly its Role (a namespace the connector's Deployment serves), and a
scale, head restart and restore through the Kubernetes backend as the connector's service account under the Role
the backend's envtest tests run under (examples/k8s/rbac.yaml)."""
import time
from pathlib import Path

import pytest
import yaml

from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
from flytekitplugins_ddlscale.backends.tiers import FileTierCatalog
from flytekitplugins_ddlscale.errors import UnauthorizedError
from flytekitplugins_ddlscale.refs import ClusterRef
from tests.envtest.sides import RealServerSide
from tests.servers.k8s_fixtures import tiers_file  # noqa: F401 - fixture

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "k8s"
CONNECTORS = ["connector.yaml", "flyte2-connector.yaml"]
ROLE_FILES = ["rbac.yaml", "kuberay-rbac.yaml", "dask-operator-rbac.yaml"]

pytestmark = pytest.mark.envtest


def _documents():
    return [(path.name, doc) for path in sorted(EXAMPLES.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
            if doc]


def _ensure_namespace(admin, name):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.CoreV1Api(admin).create_namespace({"metadata": {"name": name}})
    except ApiException as error:
        if error.status != 409:  # already there: the control plane is shared by the session
            raise


def test_every_example_document_passes_a_server_side_dry_run(envtest):
    from kubernetes.dynamic import DynamicClient

    dynamic = DynamicClient(envtest.admin)
    accepted = []
    for name, doc in _documents():
        namespace = doc["metadata"].get("namespace")
        if namespace:
            _ensure_namespace(envtest.admin, namespace)
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        answer = resource.create(body=doc, namespace=namespace, dry_run="All")
        assert answer.metadata.name == doc["metadata"]["name"], (name, doc["kind"])
        accepted.append((name, doc["kind"]))
    kinds = {kind for _, kind in accepted}
    assert {"Deployment", "Service", "NetworkPolicy", "ServiceAccount", "Role", "RoleBinding", "DaskCluster",
            "RayCluster"} <= kinds
    assert {name for name, _ in accepted} == {path.name for path in EXAMPLES.glob("*.yaml")}


def _manifest_object(manifest, kind):
    return next(d for d in yaml.safe_load_all((EXAMPLES / manifest).read_text()) if d and d["kind"] == kind)


def _service_account(manifest):
    """The user the manifest's Deployment calls the API server as (its pod's service account)."""
    deployment = _manifest_object(manifest, "Deployment")
    return (f"system:serviceaccount:{deployment['metadata']['namespace']}:"
            f"{deployment['spec']['template']['spec']['serviceAccountName']}")


def _connector_binding(role_file, manifest):
    """The RoleBinding of ``role_file`` that binds the service account of ``manifest``'s Deployment."""
    deployment = _manifest_object(manifest, "Deployment")
    account = (deployment["spec"]["template"]["spec"]["serviceAccountName"], deployment["metadata"]["namespace"])
    bindings = [d for d in yaml.safe_load_all((EXAMPLES / role_file).read_text()) if d and d["kind"] == "RoleBinding"
                and any((s["name"], s.get("namespace")) == account for s in d["subjects"])]
    assert len(bindings) == 1, f"{role_file} binds {account} {len(bindings)} times"
    return bindings[0]


def _bind_as_the_manifest_does(envtest, role_file, manifest, namespace):
    """``role_file``'s Role and its RoleBinding of ``manifest``'s service account, both in ``namespace`` (in place
    of the clusters' namespace, as the backend's envtest tests grant the Role); the Role."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(envtest.admin)
    role = _manifest_object(role_file, "Role")
    binding = _connector_binding(role_file, manifest)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    role["metadata"]["namespace"] = binding["metadata"]["namespace"] = namespace
    rbac.create_namespaced_role(namespace, role)
    rbac.create_namespaced_role_binding(namespace, binding)
    return role


def _allowed(envtest, account, namespace, verb, group, resource):
    """The API server's answer to: may ``account`` do ``verb`` on ``group``/``resource`` in ``namespace``?"""
    from kubernetes import client

    review = client.AuthorizationV1Api(envtest.admin).create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": account, "resourceAttributes": {"namespace": namespace, "verb": verb, "group": group,
                                                         "resource": resource}}})
    return review.status.allowed


def _await_binding(envtest, account, namespace, role):
    """Until the authorizer (which reads RBAC objects from its own cache) grants ``role``'s first rule, 30 s at most."""
    rule = role["rules"][0]
    deadline = time.monotonic() + 30
    while not _allowed(envtest, account, namespace, rule["verbs"][0], rule["apiGroups"][0], rule["resources"][0]):
        assert time.monotonic() < deadline, f"the RoleBinding of {account} was not in effect within 30 s"
        time.sleep(0.1)


@pytest.mark.parametrize("manifest", CONNECTORS)
@pytest.mark.parametrize("role_file", ROLE_FILES)
def test_each_role_file_gives_the_connectors_service_account_exactly_its_role(envtest, role_file, manifest):
    served = next(e["value"] for e in _manifest_object(manifest, "Deployment")["spec"]["template"]["spec"]
                  ["containers"][0]["env"] if e["name"] == "DDLSCALE_CONNECTOR_NAMESPACES").split(",")
    assert _manifest_object(role_file, "Role")["metadata"]["namespace"] in served
    namespace = envtest.new_namespace()
    role = _bind_as_the_manifest_does(envtest, role_file, manifest, namespace)
    account = _service_account(manifest)
    _await_binding(envtest, account, namespace, role)

    def allowed(verb, group, resource):
        return _allowed(envtest, account, namespace, verb, group, resource)

    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert allowed(verb, group, resource), (verb, group, resource)
    assert not allowed("create", "", "pods")
    assert not allowed("get", "", "secrets")
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert not allowed("update", group, resource) and not allowed("create", group, resource)


def test_the_backend_scales_restarts_and_restores_as_the_connectors_service_account(envtest, tiers_file):  # noqa: F811
    side = RealServerSide(tiers_file, envtest)
    try:
        side.add_cluster("ray", "c1", replicas=1)
        ref = ClusterRef("ray", "c1", side.namespace)
        client = envtest.plane.api_client(admin=True)
        # The admin may impersonate: every request of this client is authorized as the connector's service account.
        client.set_default_header("Impersonate-User", _service_account("connector.yaml"))
        backend = KubernetesBackend(namespace=side.namespace, api_client=client, tier_catalog=FileTierCatalog(tiers_file),
                                    failure_grace=0.3)
        try:
            with pytest.raises(UnauthorizedError) as refused:  # nothing bound yet: the impersonation is real
                backend.scale(ref, 2, timeout=30)
            assert f'User "{_service_account("connector.yaml")}" cannot get resource "rayclusters"' in str(refused.value)
            role = _bind_as_the_manifest_does(envtest, "rbac.yaml", "connector.yaml", side.namespace)
            _await_binding(envtest, _service_account("connector.yaml"), side.namespace, role)
            assert backend.scale(ref, 2, timeout=60).final.ready_workers == 2
            backend.restart_head(ref, timeout=60)
            assert backend.restore_baseline(ref, timeout=60).final.ready_workers == 1
        finally:
            backend.close()
            client.close()
    finally:
        side.close()
