"""A password in the scaler service URL stays out of what the client shows."""
import logging

from tests.servers.scaler_server import DEFAULT_API_KEY

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend
from flytekitplugins_ddlscale.backends.scaler.client import displayable_url
from flytekitplugins_ddlscale.redaction import redact


def test_displayable_url_drops_userinfo_only():
    assert displayable_url("http://u:p%40ss@127.0.0.1:8080/base") == "http://127.0.0.1:8080/base"
    assert displayable_url("https://scaler.example") == "https://scaler.example"


def test_url_password_is_masked_in_base_url_and_httpx_logs(scaler_server, tmp_path, caplog):
    scaler_server.add_cluster("ray", "ray-url", replicas=1)
    password = "pw-in-url-5b1e"
    url = scaler_server.url.replace("http://", f"http://someone:{password}@")
    caplog.set_level(logging.DEBUG)
    with ScalerServiceBackend(url, api_key=DEFAULT_API_KEY, state_dir=tmp_path, env={}) as backend:
        assert password not in backend.base_url and backend.base_url == scaler_server.url
        assert backend.get_state(ClusterRef("ray", "ray-url")).desired_workers == 1
    assert password not in redact(f"GET {url}")
    assert any(r.name.startswith("http") for r in caplog.records)
    assert all(password not in r.getMessage() for r in caplog.records)
