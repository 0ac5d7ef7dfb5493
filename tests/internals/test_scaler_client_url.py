"""A password in the scaler service URL stays out of what the client shows."""
import logging

from tests.servers.scaler_server import DEFAULT_API_KEY

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend
from flytekitplugins_ddlscale.backends.scaler._client import ScalerClient, credentials_in_clear, displayable_url
from flytekitplugins_ddlscale._core.redaction import redact


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


def test_credentials_in_clear_is_plain_http_to_a_host_that_is_not_loopback():
    assert credentials_in_clear("http://ddl-cluster-scaler-svc.domino-field.svc.cluster.local")
    assert credentials_in_clear("http://10.0.0.5:8080") and credentials_in_clear("http://[fd00::1]:80")
    for safe in ("https://scaler.example", "http://127.0.0.1:8080", "http://127.9.9.9", "http://[::1]:8080",
                 "http://localhost:80", "http://LOCALHOST"):
        assert not credentials_in_clear(safe), safe


def test_a_key_over_plain_http_to_another_host_is_warned_about_once(caplog):
    url = "http://scaler-warn-test.example:8080"
    with caplog.at_level(logging.WARNING, logger="flytekitplugins_ddlscale"):
        for _ in range(2):
            ScalerClient(url, env={"DOMINO_API_KEY": "key-6c1d-warn"}).close()
        ScalerClient("http://scaler-no-key.example:8080", env={}).close()  # nothing to protect
    warnings = [r.getMessage() for r in caplog.records if "plain HTTP" in r.getMessage()]
    assert warnings == [warnings[0]] and url in warnings[0] and "https://" in warnings[0]
    assert "key-6c1d-warn" not in caplog.text


def test_loopback_http_sends_no_warning(scaler_server, tmp_path, caplog):
    scaler_server.add_cluster("ray", "ray-loop", replicas=1)
    with caplog.at_level(logging.WARNING):
        with ScalerServiceBackend(scaler_server.url, api_key=DEFAULT_API_KEY, state_dir=tmp_path, env={}) as backend:
            assert backend.get_state(ClusterRef("ray", "ray-loop")).desired_workers == 1
    assert scaler_server.requests and not [r for r in caplog.records if "plain HTTP" in r.getMessage()]
