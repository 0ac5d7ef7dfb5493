"""Credentials: order of sources, proxy-token refresh, and secrets never leaking."""
import logging

import pytest

from flytekitplugins_ddlscale import BackendUnavailableError, ClusterRef, UnauthorizedError
from flytekitplugins_ddlscale.backends.scaler import ScalerOptions, ScalerServiceBackend
from flytekitplugins_ddlscale._core.waiting import Backoff
from tests.servers.scaler_server import DEFAULT_API_KEY, DEFAULT_TOKEN

RAY = ClusterRef("ray", "ray-run1")


def _backend(server, tmp_path, env):
    return ScalerServiceBackend(
        server.url, state_dir=tmp_path, env=env, options=ScalerOptions(retry_backoff=Backoff(0.01, 2.0, 0.02))
    )


def _auth_of(request):
    if "x-domino-api-key" in request.headers:
        return ("api_key", request.headers["x-domino-api-key"])
    return ("bearer", request.headers.get("authorization", "")[7:])


def test_proxy_wins_then_token_then_api_key(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-run1")
    everything = {"DOMINO_API_PROXY": scaler_server.url, "DOMINO_TOKEN": DEFAULT_TOKEN, "DOMINO_API_KEY": DEFAULT_API_KEY}
    with _backend(scaler_server, tmp_path, everything) as backend:
        backend.get_state(RAY)
    first, second = scaler_server.requests
    assert first.path == "/access-token"
    kind, value = _auth_of(second)
    assert kind == "bearer" and value.startswith("proxy-")

    scaler_server.clear_requests()
    with _backend(scaler_server, tmp_path, {"DOMINO_TOKEN": DEFAULT_TOKEN, "DOMINO_API_KEY": DEFAULT_API_KEY}) as backend:
        backend.get_state(RAY)
    assert [_auth_of(r) for r in scaler_server.requests] == [("bearer", DEFAULT_TOKEN)]

    scaler_server.clear_requests()
    with _backend(scaler_server, tmp_path, {"DOMINO_API_KEY": DEFAULT_API_KEY}) as backend:
        backend.get_state(RAY)
    assert [_auth_of(r) for r in scaler_server.requests] == [("api_key", DEFAULT_API_KEY)]


def test_proxy_token_is_reused_then_refreshed_once_when_it_expires(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    with _backend(scaler_server, tmp_path, {"DOMINO_API_PROXY": scaler_server.url}) as backend:
        backend.get_state(RAY)
        backend.get_state(RAY)
        assert scaler_server.count("GET", "/access-token") == 1
        scaler_server.expire_tokens()
        assert backend.scale(RAY, 2, timeout=5).effective == 2
    assert scaler_server.count("GET", "/access-token") == 2
    statuses = [r.status for r in scaler_server.requests if r.path.startswith("/ddl_cluster_scaler/")]
    assert 403 in statuses and statuses[-1] == 200


def test_no_credentials_is_unauthorized(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-run1")
    with _backend(scaler_server, tmp_path, {}) as backend, pytest.raises(UnauthorizedError):
        backend.get_state(RAY)


def test_unreachable_proxy_is_backend_unavailable(scaler_server, tmp_path):
    with _backend(scaler_server, tmp_path, {"DOMINO_API_PROXY": "http://127.0.0.1:9"}) as backend:
        with pytest.raises(BackendUnavailableError):
            backend.get_state(RAY)


def test_credentials_never_reach_logs_or_errors(scaler_server, tmp_path, caplog):
    secret_key = "sk-live-" + "9" * 24
    scaler_server.add_user("owner-9", api_key=secret_key)
    scaler_server.add_cluster("ray", "ray-run1", owner="someone-else")
    scaler_server.inject_faults("status", count=2, status=503)
    with caplog.at_level(logging.DEBUG):
        with _backend(scaler_server, tmp_path, {"DOMINO_API_KEY": secret_key}) as backend:
            with pytest.raises(UnauthorizedError) as info:
                backend.scale(RAY, 2)
    assert "retry" in caplog.text
    assert secret_key not in caplog.text
    assert secret_key not in str(info.value) and secret_key not in repr(info.value.args)
