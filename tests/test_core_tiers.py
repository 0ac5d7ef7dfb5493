"""Tier catalogs: parsing both shapes, resolving names per kind, Domino's endpoint."""
import json

import pytest

from flytekitplugins_ddlscale import BackendUnavailableError, CertificateRefusedError, InvalidInputError, UnknownTierError
from flytekitplugins_ddlscale.backends._support.domino_auth import DominoAuth
from flytekitplugins_ddlscale.backends.tiers import DominoTierCatalog, FileTierCatalog, parse_tiers
from tests.servers.scaler_server import DEFAULT_API_KEY, default_tiers


def test_domino_shape_becomes_kubernetes_resources():
    tiers = {t.name: t for t in parse_tiers({"hardwareTiers": default_tiers()})}
    gpu = tiers["GPU"]
    assert gpu.id == "gpu-k8s" and gpu.node_pool == "gpu" and gpu.gpus == 1
    assert gpu.resources() == {
        "requests": {"cpu": "8", "memory": "60Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "8", "memory": "60Gi", "nvidia.com/gpu": "1"},
    }
    assert gpu.allows("ray") and not gpu.allows("dask") and tiers["Small"].allows("mpi")


def test_file_catalog_short_form(tmp_path):
    path = tmp_path / "tiers.yaml"
    path.write_text("tiers:\n- {name: half, cores: 0.5, memory: 2Gi, restrictTo: [dask]}\n- {name: big, cores: 16, memory: 64Gi}\n")
    catalog = FileTierCatalog(path)
    half = catalog.resolve("half", "daskclusters")
    assert half.resources()["requests"] == {"cpu": "500m", "memory": "2Gi"}
    assert catalog.resolve(None, "ray") is None
    with pytest.raises(UnknownTierError) as info:
        catalog.resolve("half", "ray")
    assert "restricted to dask" in str(info.value) and "big" in str(info.value)
    with pytest.raises(UnknownTierError):
        catalog.resolve("huge", "ray")
    with pytest.raises(InvalidInputError):
        catalog.resolve("", "ray")


def test_file_catalog_accepts_domino_json(tmp_path):
    path = tmp_path / "tiers.json"
    path.write_text(json.dumps({"hardwareTiers": default_tiers()}))
    assert FileTierCatalog(path).resolve("Spark Only", "spark").id == "spark-k8s"


def test_domino_catalog_reads_once_and_caches(scaler_server):
    catalog = DominoTierCatalog(scaler_server.url, auth=DominoAuth(api_key=DEFAULT_API_KEY))
    assert catalog.resolve("Medium", "ray").cores == 4
    assert len(catalog.tiers()) == 4
    assert scaler_server.count("GET", "/v4/hardwareTier") == 1


def test_domino_catalog_errors(scaler_server):
    with pytest.raises(BackendUnavailableError) as info:
        DominoTierCatalog(scaler_server.url, auth=DominoAuth(env={})).tiers()
    assert info.value.status_code == 401
    with pytest.raises(BackendUnavailableError):
        DominoTierCatalog("http://127.0.0.1:9", timeout=1).tiers()


def test_domino_catalog_over_tls_refuses_an_untrusted_certificate(scaler_server, tmp_path):
    from tests.reliability.rel_proxy import FaultProxy
    from tests.reliability.rel_tls import self_signed_cert, server_context

    cert, key = self_signed_cert(tmp_path)
    with FaultProxy.before(scaler_server.url, tls=server_context(cert, key)) as proxy:
        auth = DominoAuth(api_key=DEFAULT_API_KEY)
        with pytest.raises(CertificateRefusedError, match="TLS certificate was refused"):
            DominoTierCatalog(proxy.url, auth=auth, timeout=5).tiers()
        assert scaler_server.count("GET", "/v4/hardwareTier") == 0
        assert len(DominoTierCatalog(proxy.url, auth=auth, timeout=5, verify=False).tiers()) == 4
