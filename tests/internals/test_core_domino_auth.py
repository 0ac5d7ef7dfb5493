"""DominoAuth against the test server's proxy and Nucleus routes."""
import httpx
import pytest

from flytekitplugins_ddlscale import BackendUnavailableError, UnauthorizedError
from flytekitplugins_ddlscale.backends._support.domino_auth import DominoAuth
from flytekitplugins_ddlscale._core.redaction import redact
from tests.servers.scaler_server import DEFAULT_API_KEY, DEFAULT_TOKEN


def test_source_order():
    assert DominoAuth(token="t-explicit", env={"DOMINO_API_PROXY": "http://p"}).source == "token"
    assert DominoAuth(env={"DOMINO_API_PROXY": "http://p", "DOMINO_TOKEN": "t-1234"}).source == "proxy"
    assert DominoAuth(env={"DOMINO_TOKEN": "t-1234", "DOMINO_API_KEY": "k-1234"}).source == "token"
    assert DominoAuth(env={"DOMINO_API_KEY": "k-1234"}).source == "api_key"
    assert DominoAuth(env={}).source == "none"


def test_values_read_are_registered_as_secrets():
    DominoAuth(env={"DOMINO_TOKEN": "t-registered-1"})
    assert "t-registered-1" not in redact("x t-registered-1 y")


def test_nucleus_401_refreshes_the_proxy_token_once(scaler_server):
    auth = DominoAuth(env={"DOMINO_API_PROXY": scaler_server.url})
    with httpx.Client(base_url=scaler_server.url, auth=auth) as client:
        assert client.get("/v4/hardwareTier").status_code == 200
        scaler_server.expire_tokens()
        assert client.get("/v4/hardwareTier").status_code == 200
    assert scaler_server.count("GET", "/access-token") == 2
    assert [r.status for r in scaler_server.requests if r.path == "/v4/hardwareTier"] == [200, 401, 200]


def test_persistent_403_is_refreshed_only_once(scaler_server):
    scaler_server.proxy_user = "nobody"
    scaler_server.add_cluster("ray", "ray-run1")
    auth = DominoAuth(env={"DOMINO_API_PROXY": scaler_server.url})
    with httpx.Client(base_url=scaler_server.url, auth=auth) as client:
        assert client.get("/ddl_cluster_scaler/cluster/rayclusters/ray-run1").status_code == 403
    assert scaler_server.count("GET", "/access-token") == 2
    assert scaler_server.count("GET", "/cluster/") == 2


def test_static_credentials_are_sent_as_is(scaler_server):
    with httpx.Client(base_url=scaler_server.url, auth=DominoAuth(api_key=DEFAULT_API_KEY)) as client:
        assert client.get("/v4/auth/principal").json()["canonicalId"] == "owner-1"
    with httpx.Client(base_url=scaler_server.url, auth=DominoAuth(token=DEFAULT_TOKEN)) as client:
        assert client.get("/v4/auth/principal").status_code == 200
    assert scaler_server.requests[0].headers["x-domino-api-key"] == DEFAULT_API_KEY
    assert scaler_server.requests[1].headers["authorization"] == f"Bearer {DEFAULT_TOKEN}"


def test_proxy_failures_are_typed(scaler_server):
    with httpx.Client(auth=DominoAuth(api_proxy="http://127.0.0.1:9")) as client:
        with pytest.raises(BackendUnavailableError):
            client.get(f"{scaler_server.url}/healthz")
    with httpx.Client(auth=DominoAuth(api_proxy=f"{scaler_server.url}/nowhere")) as client:
        with pytest.raises(UnauthorizedError):
            client.get(f"{scaler_server.url}/healthz")
