"""The Kubernetes backend configured as users configure it (a kubeconfig with a bearer token):
TLS verified by default with an explicit opt-out, the token never in logs or errors, and the
kubeconfig taken from ``$KUBECONFIG`` as it is when the backend is made.
"""
import logging
import secrets
from pathlib import Path
from typing import Any, Iterator, List, Optional

import pytest
from rel_proxy import FaultProxy
from rel_secrets import exception_texts, leaks
from rel_tls import self_signed_cert, server_context

from flytekitplugins_ddlscale import CertificateRefusedError, ClusterRef, ScalingError
from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

NAME = "ray-k8s-tls"
REF = ClusterRef("ray", NAME)


def write_kubeconfig(path: Path, server: str, token: str, *, ca: Optional[Path] = None, insecure: bool = False) -> Path:
    cluster = f"server: '{server}'"
    if ca is not None:
        cluster += f", certificate-authority: '{ca}'"
    if insecure:
        cluster += ", insecure-skip-tls-verify: true"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: t, cluster: {{{cluster}}}}}]\n"
        f"users: [{{name: u, user: {{token: '{token}'}}}}]\n"
        "contexts: [{name: t, context: {cluster: t, user: u}}]\ncurrent-context: t\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def cluster(k8s_server: Any, clean_env: Path) -> ClusterRef:
    k8s_server.add_cluster("ray", NAME, replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 4})
    k8s_server.clear_log()
    return REF


@pytest.fixture
def tls(k8s_server: Any, tmp_path: Path) -> Iterator[Any]:
    """The Kubernetes test server behind TLS (self-signed certificate for 127.0.0.1); yields (proxy, cert)."""
    cert, key = self_signed_cert(tmp_path)
    with FaultProxy.before(k8s_server.url, tls=server_context(cert, key)) as proxy:
        yield proxy, cert


@pytest.fixture
def token() -> str:
    return "kube-sa-token-" + secrets.token_hex(16)


def run(backend: KubernetesBackend) -> List[BaseException]:
    errors: List[BaseException] = []
    try:
        backend.get_state(REF)
        backend.scale(REF, 2, wait=True, timeout=20)
        for call in (lambda: backend.get_state(ClusterRef("ray", "ray-missing")), lambda: backend.scale(REF, 2, "nope")):
            try:
                call()
            except ScalingError as exc:
                errors.append(exc)
    finally:
        backend.close()
    return errors


def test_tls_verified_by_default(cluster, k8s_server, tls, tmp_path, token, caplog, capfd):
    proxy, _ = tls
    caplog.set_level(logging.DEBUG)
    config = write_kubeconfig(tmp_path / "kc", proxy.url, token)
    backend = KubernetesBackend(kubeconfig=str(config), request_timeout=5)
    try:
        with pytest.raises(CertificateRefusedError, match="TLS certificate was refused") as caught:
            backend.get_state(REF)
    finally:
        backend.close()
    assert proxy.accepted >= 1
    assert k8s_server.requests == []  # nothing (and no token) got past the refused handshake
    out, err = capfd.readouterr()
    assert leaks([token], exception_texts(caught.value) + [caplog.text, out, err]) == []


def test_tls_with_the_cluster_ca_works(cluster, k8s_server, tls, tmp_path, token, caplog, capfd):
    proxy, cert = tls
    caplog.set_level(logging.DEBUG)
    config = write_kubeconfig(tmp_path / "kc", proxy.url, token, ca=cert)
    errors = run(KubernetesBackend(kubeconfig=str(config), request_timeout=5, tiers_file=None))
    assert k8s_server.get_object("ray", NAME)["spec"]["worker"]["replicas"] == 2
    out, err = capfd.readouterr()
    assert errors and leaks([token], [t for e in errors for t in exception_texts(e)] + [caplog.text, out, err]) == []


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_tls_explicit_opt_out_works(cluster, k8s_server, tls, tmp_path, token):
    proxy, _ = tls
    config = write_kubeconfig(tmp_path / "kc", proxy.url, token, insecure=True)
    backend = KubernetesBackend(kubeconfig=str(config), request_timeout=5)
    try:
        assert backend.get_state(REF).desired_workers == 1
    finally:
        backend.close()


def test_kubeconfig_env_is_read_when_the_backend_is_made(cluster, k8s_server, tmp_path, token, monkeypatch):
    import kubernetes.config  # noqa: F401 - imported before KUBECONFIG is set, as in a long-lived process

    config = write_kubeconfig(tmp_path / "kc", k8s_server.url, token)
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    backend = KubernetesBackend()
    try:
        assert backend.get_state(REF).desired_workers == 1
    finally:
        backend.close()
