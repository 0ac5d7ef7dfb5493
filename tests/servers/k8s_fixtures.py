"""Pytest fixtures for tests of the Kubernetes backend against :class:`K8sTestServer`.

Import them into a test module: ``from tests.servers.k8s_fixtures import k8s, backend, tiers_file``.
The test server and the ``kubernetes`` client are imported when a fixture is used (together most of
a second), so a conftest can import these fixtures for the few tests that use them.
"""
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import pytest

if TYPE_CHECKING:
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

    from .k8s_server import K8sTestServer

TIERS_YAML = """\
tiers:
  - {name: small, id: small-k8s, cores: 1, memory: 2Gi}
  - {name: medium, id: medium-k8s, cores: 2, memory: 8Gi, nodePool: default}
  - {name: gpu, id: gpu-k8s, cores: 4, memory: 16Gi, gpus: 1, nodePool: gpu-pool}
  - {name: spark-only, id: spark-only-k8s, cores: 2, memory: 4Gi, restrictTo: [spark]}
"""


@pytest.fixture
def k8s() -> "Iterator[K8sTestServer]":
    """A running test API server with fast pods (Ready after 20 ms)."""
    from .k8s_server import K8sTestServer

    with K8sTestServer(ready_delay=0.02) as server:
        yield server


@pytest.fixture
def tiers_file(tmp_path: Path) -> Path:
    """A tier catalog YAML file in this plugin's short form."""
    path = tmp_path / "tiers.yaml"
    path.write_text(TIERS_YAML, encoding="utf-8")
    return path


@contextlib.contextmanager
def make_backend(server: "K8sTestServer", tiers: Path, **options: Any) -> "Iterator[KubernetesBackend]":
    """A backend talking to ``server`` with the tiers of ``tiers``; its client is closed on exit."""
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
    from flytekitplugins_ddlscale.backends.tiers import FileTierCatalog

    options.setdefault("failure_grace", 0.3)
    client = server.api_client()
    instance = KubernetesBackend(api_client=client, tier_catalog=FileTierCatalog(tiers), **options)
    try:
        yield instance
    finally:
        instance.close()
        client.close()


@pytest.fixture
def backend(k8s: "K8sTestServer", tiers_file: Path) -> "Iterator[KubernetesBackend]":
    """A backend for :func:`k8s`, closed after the test."""
    with make_backend(k8s, tiers_file) as instance:
        yield instance


def role_rules(path: Path) -> "set":
    """The ``(verb, test-server resource)`` pairs the Role in the YAML file at ``path`` allows,
    for :meth:`K8sTestServer.allow_only` (resources of other API groups than core and Domino's
    are named ``<plural>.<group>`` there)."""
    import yaml

    from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP

    role = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Role")
    rules = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = resource if group in ("", CRD_GROUP) else f"{resource}.{group}"
                rules.update((verb, key) for verb in rule["verbs"])
    return rules
