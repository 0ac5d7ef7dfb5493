"""The envtest tier's real control plane with everything around it, started as one unit (no pytest here).

:func:`start_envtest` starts etcd, kube-apiserver and kube-controller-manager
(:mod:`controlplane`), installs the repository's CRDs (:mod:`crds`) and,
optionally, the DCO's admission webhook (:mod:`dco_webhook`), and runs the
kubelet's part (:mod:`kubelet`) and the DCO stand-in (:mod:`dco_operator`)
until the block ends. The tier's ``envtest`` fixture (:mod:`fixtures`) and the
benchmarks' real-server variant (``benchmarks/real_k8s.py``) both start it
this way.
"""
import contextlib
import itertools
import secrets
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import yaml

from .controlplane import USER, ControlPlane
from .crds import install
from .dco_operator import DcoStandIn
from .dco_webhook import DcoWebhook
from .kubelet import FakeKubelet

READY_DELAY = 0.05
"""Seconds the fake kubelet takes to make a new pod Ready: short, so the tier stays within its time budget."""
_numbers = itertools.count(1)


class Envtest:
    """The running control plane and the helpers tests use on it."""

    def __init__(self, plane: ControlPlane, admin: Any, kubelet: FakeKubelet, operator: DcoStandIn) -> None:
        self.plane = plane
        self.admin = admin
        """An admin ``kubernetes.client.ApiClient``; tests must not close it."""
        self.kubelet = kubelet
        self.operator = operator

    def new_namespace(self) -> str:
        """A fresh namespace: each test gets its own, so tests sharing the control plane never meet."""
        from kubernetes import client

        name = f"t{next(_numbers)}-{secrets.token_hex(3)}"
        client.CoreV1Api(self.admin).create_namespace({"metadata": {"name": name}})
        return name

    def grant(self, role_file: Path, namespace: str, without: Optional[Tuple[str, str]] = None) -> List[str]:
        """:func:`grant` on this control plane."""
        return grant(self.admin, role_file, namespace, without)

    def health(self) -> Dict[str, List[str]]:
        """Errors the kubelet and the DCO stand-in met lately (for a failing test's message)."""
        return {"kubelet": list(self.kubelet.errors), "dco": list(self.operator.errors)}


def grant(admin: Any, role_file: Path, namespace: str, without: Optional[Tuple[str, str]] = None) -> List[str]:
    """Create the Role and RoleBinding of ``role_file`` (a shipped ``examples/k8s/*rbac.yaml``) in
    ``namespace`` with ``admin`` (an admin ``ApiClient``), exactly as written but for the namespace and the
    binding's subject, which becomes the non-admin user's service account (:data:`~.controlplane.USER`; the
    files bind "the service account of your task pods"); ``without`` = ``(verb, resource)`` takes that one
    permission out of the Role. Returns the Role names."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(admin)
    account_namespace, account = USER.split(":")[2:]
    roles = []
    for document in yaml.safe_load_all(role_file.read_text()):
        document["metadata"]["namespace"] = namespace
        if document["kind"] == "Role":
            if without is not None:
                document["rules"] = _without(document["rules"], *without)
            rbac.create_namespaced_role(namespace, document)
            roles.append(document["metadata"]["name"])
        elif document["kind"] == "RoleBinding":
            document["subjects"] = [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace}]
            rbac.create_namespaced_role_binding(namespace, document)
    return roles


def _without(rules: List[Dict[str, Any]], verb: str, resource: str) -> List[Dict[str, Any]]:
    """``rules`` with ``verb`` on ``resource`` taken out (the rule split in two where it names more)."""
    kept = []
    for rule in rules:
        if resource in rule["resources"] and verb in rule["verbs"]:
            others = [r for r in rule["resources"] if r != resource]
            if others:
                kept.append(dict(rule, resources=others))
            verbs = [v for v in rule["verbs"] if v != verb]
            if verbs:
                kept.append(dict(rule, resources=[resource], verbs=verbs))
        else:
            kept.append(rule)
    return kept


@contextlib.contextmanager
def start_envtest(folder: Path, *, webhook: bool = True, pod_watch_cache: bool = False,
                  work: Optional[Path] = None) -> Iterator[Envtest]:
    """A running control plane from the packed binaries in ``folder``, with the CRDs, the webhook (unless
    ``webhook`` is False), the fake kubelet (:data:`READY_DELAY`) and the DCO stand-in; all stopped when the
    block ends. ``pod_watch_cache`` and ``work``: see :class:`~.controlplane.ControlPlane`."""
    with ControlPlane(folder, work=work, pod_watch_cache=pod_watch_cache) as plane:
        admin = plane.api_client()
        with contextlib.ExitStack() as stack:
            stack.callback(admin.close)
            install(admin)
            if webhook:
                hook = DcoWebhook(plane.work / "certs").start()
                stack.callback(hook.stop)
                hook.register(admin)
            kubelet = FakeKubelet(admin, ready_delay=READY_DELAY).start()
            stack.callback(kubelet.stop)
            operator = DcoStandIn(admin).start()
            stack.callback(operator.stop)
            yield Envtest(plane, admin, kubelet, operator)
