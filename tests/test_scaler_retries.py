"""Bounded retries and timeouts of the scaler client, against injected faults."""
import time

import pytest

from flytekitplugins_ddlscale import (
    BackendUnavailableError, CertificateRefusedError, ClusterRef, InvalidInputError, NeverReachedError, ScalingError, TransientError,
)
from flytekitplugins_ddlscale.backends.scaler import ScalerOptions, ScalerServiceBackend
from flytekitplugins_ddlscale._core.waiting import Backoff
from tests.servers.scaler_server import DEFAULT_API_KEY

RAY = ClusterRef("ray", "ray-run1")


@pytest.mark.parametrize("status", [502, 503, 504])
def test_get_is_retried_on_gateway_errors(scaler_server, scaler_backend, status):
    scaler_server.add_cluster("ray", "ray-run1", replicas=2)
    scaler_server.inject_faults("status", count=2, status=status)
    assert scaler_backend.get_state(RAY).existing_workers == 2
    assert scaler_server.count("GET", "/cluster/") == 3


def test_scale_is_retried_on_dropped_connections(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    scaler_server.inject_faults("drop", count=2, path="/scale/")
    result = scaler_backend.scale(RAY, 2, timeout=5)
    assert result.effective == 2
    assert scaler_server.count("PATCH", "/scale/") == 3


def test_retries_are_bounded_and_back_off_exponentially(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-run1")
    scaler_server.inject_faults("status", count=100, status=503)
    delays = []

    def recording_sleep(seconds):
        delays.append(seconds)
        time.sleep(seconds)

    backend = ScalerServiceBackend(
        scaler_server.url,
        api_key=DEFAULT_API_KEY,
        state_dir=tmp_path,
        options=ScalerOptions(retries=3, retry_backoff=Backoff(initial=0.01, factor=2.0, cap=0.03), sleep=recording_sleep),
    )
    with backend, pytest.raises(BackendUnavailableError) as info:
        backend.get_state(RAY)
    assert scaler_server.count("GET", "/cluster/") == 4
    assert delays == [0.01, 0.02, 0.03]
    assert info.value.status_code == 503


def test_errors_that_are_not_transient_are_not_retried(scaler_server, scaler_backend):
    scaler_server.inject_faults("status", count=5, status=500)
    with pytest.raises(ScalingError) as info:
        scaler_backend.get_state(RAY)
    assert not isinstance(info.value, BackendUnavailableError) and info.value.status_code == 500
    assert scaler_server.count("GET", "/cluster/") == 1


def test_each_call_has_a_timeout_and_slow_answers_are_retried(scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    scaler_server.inject_faults("delay", count=1, delay=2.0)
    backend = ScalerServiceBackend(
        scaler_server.url, api_key=DEFAULT_API_KEY, state_dir=tmp_path,
        options=ScalerOptions(timeout=0.3, retry_backoff=Backoff(0.01, 2.0, 0.02)),
    )
    with backend:
        assert backend.get_state(RAY).existing_workers == 1
    assert scaler_server.count("GET", "/cluster/") == 2


def test_unreachable_service_is_never_reached_not_transient(tmp_path):
    backend = ScalerServiceBackend(
        "http://127.0.0.1:9", api_key=DEFAULT_API_KEY, state_dir=tmp_path,
        options=ScalerOptions(retries=1, retry_backoff=Backoff(0.01, 2.0, 0.02)),
    )
    with backend, pytest.raises(NeverReachedError) as info:
        backend.get_state(RAY)
    # Never reached: not an outage, so not retried (an access error, not a transient one).
    assert not isinstance(info.value, TransientError)
    assert "has not answered once" in str(info.value) and "ConnectError" in str(info.value)


def test_retry_count_is_validated(tmp_path):
    with pytest.raises(InvalidInputError, match="retries"):
        ScalerServiceBackend("http://127.0.0.1:9", api_key="k-1234", state_dir=tmp_path, options=ScalerOptions(retries=-1))


def test_tls_verification_is_on_by_default_and_can_be_turned_off(tmp_path):
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    # A TLS listener with a certificate nobody trusts: verification must refuse it.
    cert, key = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"spec": {"worker": {"replicas": 0}}, "status": {"clusterStatus": "Running"}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    url = f"https://127.0.0.1:{httpd.server_address[1]}"
    try:
        with ScalerServiceBackend(url, api_key="k-1234", state_dir=tmp_path, options=ScalerOptions(retries=0)) as backend:
            with pytest.raises(CertificateRefusedError, match="TLS certificate was refused"):
                backend.get_state(RAY)
        with ScalerServiceBackend(
            url, api_key="k-1234", state_dir=tmp_path, options=ScalerOptions(retries=0, verify=False)
        ) as backend:
            assert backend.get_state(RAY).status == "Running"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _self_signed(tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


def test_patch_failure_carries_the_state_read_before(scaler_server, scaler_backend):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    scaler_server.inject_faults("status", count=50, status=503, path="/scale/")
    with pytest.raises(BackendUnavailableError) as info:
        scaler_backend.scale(RAY, 3)
    assert info.value.state is not None and info.value.state.desired_workers == 1


def test_failed_poll_during_a_wait_carries_the_last_state(scaler_server, scaler_backend):
    import threading

    from flytekitplugins_ddlscale import ClusterNotFoundError

    scaler_server.add_cluster("ray", "ray-run1", replicas=1, pod_ready_delay=30)
    deleter = threading.Timer(0.3, scaler_server.remove_cluster, args=("ray", "ray-run1"))
    deleter.start()
    try:
        with pytest.raises(ClusterNotFoundError) as info:
            scaler_backend.scale(RAY, 3, timeout=10)
    finally:
        deleter.join()
    state = info.value.state
    assert state is not None and (state.desired_workers, state.existing_workers) == (3, 1)
