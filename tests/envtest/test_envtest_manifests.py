"""Every document under examples/k8s/ is accepted by the real kube-apiserver, and the connectors' bindings give
their service accounts the Role the Kubernetes backend's envtest tests run under (examples/k8s/rbac.yaml)."""
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "k8s"
CONNECTORS = ["connector.yaml", "flyte2-connector.yaml"]

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


@pytest.mark.parametrize("manifest", CONNECTORS)
def test_the_connectors_service_account_gets_exactly_the_backends_role(envtest, manifest):
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(envtest.admin)
    namespace = envtest.new_namespace()  # in place of the clusters' namespace, as the backend's tests do
    role = next(d for d in yaml.safe_load_all((EXAMPLES / "rbac.yaml").read_text()) if d["kind"] == "Role")
    role["metadata"]["namespace"] = namespace
    rbac.create_namespaced_role(namespace, role)
    binding = next(d for d in yaml.safe_load_all((EXAMPLES / manifest).read_text()) if d and d["kind"] == "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    binding["metadata"]["namespace"] = namespace
    rbac.create_namespaced_role_binding(namespace, binding)
    deployment = next(d for d in yaml.safe_load_all((EXAMPLES / manifest).read_text()) if d and d["kind"] == "Deployment")
    account = (f"system:serviceaccount:{deployment['metadata']['namespace']}:"
               f"{deployment['spec']['template']['spec']['serviceAccountName']}")
    authorization = client.AuthorizationV1Api(envtest.admin)

    def allowed(verb, group, resource):
        review = authorization.create_subject_access_review({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": account, "resourceAttributes": {"namespace": namespace, "verb": verb, "group": group,
                                                             "resource": resource}}})
        return review.status.allowed

    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert allowed(verb, group, resource), (verb, group, resource)
    assert not allowed("create", "", "pods")
    assert not allowed("get", "", "secrets")
    assert not allowed("update", "distributed-compute.dominodatalab.com", "rayclusters")
