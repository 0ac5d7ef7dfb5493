"""Faults on the scaler service: 5xx bursts, refused/reset connections, slow answers,
token expiry, the service restarting mid-wait.

Contract: safe operations (reads, scale to an absolute count) retry within
bounds; a head restart is sent at most once; every failure ends in a typed
ScalingError, with the last known cluster state where one was known.
"""
import time
from pathlib import Path
from typing import Iterator

import pytest
from rel_helpers import When, desired, patched, polling, scale_bodies
from rel_proxy import FaultProxy

from flytekitplugins_ddlscale import (
    BackendUnavailableError,
    ClusterRef,
    ScalingError,
    ScalingTimeoutError,
    UnauthorizedError,
)
from tests.servers.scaler_server import ScalerTestServer

RAY = ClusterRef("ray", "ray-faults")
RETRIES = 3


@pytest.fixture
def cluster(scaler_server: ScalerTestServer) -> ClusterRef:
    scaler_server.add_cluster("ray", RAY.name, replicas=1, max_replicas=6)
    return RAY


@pytest.fixture
def proxy(scaler_server: ScalerTestServer) -> Iterator[FaultProxy]:
    with FaultProxy.before(scaler_server.url) as running:
        yield running


# ----- 5xx bursts -----


def test_5xx_burst_within_retry_budget_is_absorbed(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=RETRIES)
    scaler_server.inject_faults("status", RETRIES, status=503, path="/scale/")
    result = backend.scale(cluster, 3, wait=True, timeout=10)
    assert result.effective == 3 and result.final.existing_workers == 3
    assert scaler_server.count("PATCH", "/scale/") == RETRIES + 1
    assert scale_bodies(scaler_server, cluster.name) == [3]


def test_5xx_burst_beyond_budget_stops_after_bounded_attempts(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=RETRIES)
    scaler_server.inject_faults("status", 50, status=502, path="/scale/")
    with pytest.raises(BackendUnavailableError) as caught:
        backend.scale(cluster, 3, wait=True, timeout=10)
    assert scaler_server.count("PATCH", "/scale/") == RETRIES + 1
    assert desired(scaler_server, "ray", cluster.name) == 1
    assert "502" in str(caught.value)


def test_5xx_burst_beyond_budget_error_carries_last_known_state(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=RETRIES)
    scaler_server.inject_faults("status", 50, status=503, path="/scale/")
    with pytest.raises(BackendUnavailableError) as caught:
        backend.scale(cluster, 3, wait=True, timeout=10)
    assert caught.value.state is not None
    assert caught.value.state.desired_workers == 1


def test_5xx_on_polls_during_wait_is_absorbed(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=RETRIES)
    scaler_server.set_pod_ready_delay(0.4)
    burst = lambda: scaler_server.inject_faults("status", 2, status=504, path="/cluster/")  # noqa: E731
    with When(patched(scaler_server, cluster.name), burst) as fault:
        result = backend.scale(cluster, 4, wait=True, timeout=10)
    assert fault.fired
    assert result.final.existing_workers == 4
    assert sum(1 for r in scaler_server.requests if "/cluster/" in r.path and r.status == 504) == 2


def test_non_retryable_500_is_not_retried(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=RETRIES)
    scaler_server.inject_faults("status", 1, status=500, path="/scale/")
    with pytest.raises(ScalingError) as caught:
        backend.scale(cluster, 2, wait=False)
    assert caught.value.status_code == 500
    assert scaler_server.count("PATCH", "/scale/") == 1


# ----- connection refused / reset -----


def test_connection_refused_is_bounded_and_typed(make_scaler, proxy, cluster):
    backend = make_scaler(base_url=proxy.url, retries=RETRIES)
    backend.get_state(cluster)  # reached once: a service never reached is not retried at all
    proxy.go_down()
    with pytest.raises(BackendUnavailableError) as caught:
        backend.get_state(cluster)
    assert f"failed {RETRIES + 1} times" in str(caught.value)
    assert "ConnectError" in str(caught.value)
    proxy.come_up()
    assert backend.get_state(cluster).desired_workers == 1


def test_connection_reset_on_safe_calls_is_retried(make_scaler, scaler_server, proxy, cluster):
    backend = make_scaler(base_url=proxy.url, retries=RETRIES)
    proxy.reset_next(2)
    result = backend.scale(cluster, 2, wait=False)
    assert result.effective == 2
    assert proxy.accepted >= 3
    assert scale_bodies(scaler_server, cluster.name) == [2]


# ----- head restart sent at most once -----


@pytest.mark.parametrize(
    "fault",
    [
        dict(kind="status", status=503),
        dict(kind="status", status=502),
        dict(kind="drop"),
    ],
    ids=["503", "502", "dropped-answer"],
)
def test_head_restart_is_never_sent_twice(make_scaler, scaler_server, cluster, fault):
    backend = make_scaler(retries=RETRIES)
    scaler_server.inject_faults(count=5, path="/restart_head/", method="PATCH", **fault)
    with pytest.raises(BackendUnavailableError):
        backend.restart_head(cluster, wait=True, timeout=5)
    assert scaler_server.count("PATCH", "/restart_head/") == 1


def test_head_restart_answer_slower_than_timeout_is_not_resent(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=RETRIES, timeout=0.3)
    scaler_server.inject_faults("delay", 1, delay=1.0, path="/restart_head/", method="PATCH")
    with pytest.raises(BackendUnavailableError) as caught:
        backend.restart_head(cluster, wait=True, timeout=5)
    assert "may or may not have happened" in str(caught.value)
    time.sleep(1.0)  # the service finishes the slow request; nothing else may follow it
    assert scaler_server.count("PATCH", "/restart_head/") == 1


def test_head_restart_status_polls_survive_5xx(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=RETRIES)
    scaler_server.inject_faults("status", 2, status=503, path="/restart_head_status/")
    result = backend.restart_head(cluster, wait=True, timeout=10)
    assert result.ready
    assert scaler_server.count("PATCH", "/restart_head/") == 1


# ----- slow answers -----


def test_one_slow_answer_past_the_timeout_is_retried(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=RETRIES, timeout=0.3)
    scaler_server.inject_faults("delay", 1, delay=1.0, path="/cluster/")
    assert backend.get_state(cluster).desired_workers == 1
    assert scaler_server.count("GET", "/cluster/") == 2


def test_always_slow_service_ends_in_typed_error(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=1, timeout=0.3)
    scaler_server.inject_faults("delay", 10, delay=1.0, path="/cluster/")
    with pytest.raises(BackendUnavailableError) as caught:
        backend.get_state(cluster)
    assert "ReadTimeout" in str(caught.value)
    assert scaler_server.count("GET", "/cluster/") == 2


# ----- token expiry -----


@pytest.fixture
def proxy_auth_env(monkeypatch: pytest.MonkeyPatch, scaler_server: ScalerTestServer, clean_env: Path) -> None:
    """Credentials from ``$DOMINO_API_PROXY`` (the test server's /access-token), as inside a Domino run."""
    monkeypatch.setenv("DOMINO_API_PROXY", scaler_server.url)


def test_401_mid_wait_refreshes_the_proxy_token_once(make_scaler, scaler_server, cluster, proxy_auth_env):
    backend = make_scaler(api_key=None)
    scaler_server.set_pod_ready_delay(0.4)
    refuse = lambda: scaler_server.inject_faults("status", 1, status=401, path="/cluster/")  # noqa: E731
    with When(patched(scaler_server, cluster.name), refuse) as fault:
        result = backend.scale(cluster, 3, wait=True, timeout=10)
    assert fault.fired
    assert result.final.existing_workers == 3
    assert scaler_server.count("GET", "/access-token") == 2
    refused = [r for r in scaler_server.requests if r.status == 401]
    retried = [r for r in scaler_server.requests if r.path == refused[0].path and r.status == 200]
    assert refused and retried
    assert refused[0].headers["authorization"] != retried[-1].headers["authorization"]


def test_401_twice_in_a_row_is_unauthorized_not_a_loop(make_scaler, scaler_server, cluster, proxy_auth_env):
    backend = make_scaler(api_key=None)
    scaler_server.inject_faults("status", 5, status=401, path="/cluster/")
    with pytest.raises(UnauthorizedError):
        backend.get_state(cluster)
    assert scaler_server.count("GET", "/cluster/") == 2
    assert scaler_server.count("GET", "/access-token") == 2


def test_token_expiring_mid_wait_is_refreshed(make_scaler, scaler_server, cluster, proxy_auth_env):
    backend = make_scaler(api_key=None)
    scaler_server.set_pod_ready_delay(0.5)
    with When(patched(scaler_server, cluster.name), scaler_server.expire_tokens) as fault:
        result = backend.scale(cluster, 3, wait=True, timeout=10)
    assert fault.fired
    assert result.final.existing_workers == 3
    assert scaler_server.count("GET", "/access-token") == 2


# ----- the service restarting during a wait -----


def test_service_restart_shorter_than_retry_budget_does_not_end_the_wait(make_scaler, scaler_server, proxy, cluster):
    from flytekitplugins_ddlscale.backends.scaler._client import DEFAULT_RETRY_BACKOFF

    backend = make_scaler(base_url=proxy.url, retries=RETRIES, retry_backoff=DEFAULT_RETRY_BACKOFF)
    scaler_server.set_pod_ready_delay(0.8)

    def restart() -> None:
        proxy.go_down()
        time.sleep(0.3)
        proxy.come_up()

    with When(patched(scaler_server, cluster.name), restart) as fault:
        result = backend.scale(cluster, 4, wait=True, timeout=10)
    assert fault.fired
    assert result.final.existing_workers == 4
    assert set(scale_bodies(scaler_server, cluster.name)) == {4}


def test_service_gone_for_good_during_a_wait_ends_in_a_timeout_naming_the_outage(
    make_scaler, scaler_server, proxy, cluster
):
    backend = make_scaler(base_url=proxy.url, retries=RETRIES)
    scaler_server.set_pod_ready_delay(5.0)
    with When(patched(scaler_server, cluster.name), proxy.go_down):
        with pytest.raises(ScalingTimeoutError) as caught:
            backend.scale(cluster, 4, wait=True, timeout=3)
    assert "unreachable for" in str(caught.value) and "still unreachable at the end" in str(caught.value)
    assert set(scale_bodies(scaler_server, cluster.name)) == {4}


def test_service_gone_during_a_wait_error_carries_last_state(make_scaler, scaler_server, proxy, cluster):
    backend = make_scaler(base_url=proxy.url, retries=RETRIES)
    scaler_server.set_pod_ready_delay(5.0)
    with When(polling(scaler_server, cluster.name), proxy.go_down) as fault:
        with pytest.raises(ScalingTimeoutError) as caught:
            backend.scale(cluster, 4, wait=True, timeout=3)
    assert fault.fired
    assert caught.value.state is not None
    assert caught.value.state.desired_workers == 4


def test_wait_timeout_carries_last_state_and_says_what_it_waited_for(make_scaler, scaler_server, cluster):
    backend = make_scaler()
    scaler_server.set_pod_ready_delay(30.0)
    with pytest.raises(ScalingTimeoutError) as caught:
        backend.scale(cluster, 3, wait=True, timeout=0.5)
    err = caught.value
    assert err.state is not None and err.state.desired_workers == 3 and err.state.existing_workers == 1
    assert "3 worker pods" in str(err) and "timed out" in str(err)


def test_cluster_deleted_during_a_wait_is_not_found(make_scaler, scaler_server, cluster):
    backend = make_scaler()
    scaler_server.set_pod_ready_delay(5.0)
    delete = lambda: scaler_server.remove_cluster("ray", cluster.name)  # noqa: E731
    with When(patched(scaler_server, cluster.name), delete) as fault:
        with pytest.raises(ScalingError) as caught:
            backend.scale(cluster, 3, wait=True, timeout=10)
    assert fault.fired
    assert caught.value.code == "not_found"


def test_no_credentials_is_a_typed_error_not_a_crash(make_scaler, scaler_server, cluster):
    backend = make_scaler(api_key=None)
    with pytest.raises(UnauthorizedError):
        backend.get_state(cluster)
    assert scaler_server.count("GET", "/cluster/") == 1


def test_other_users_key_cannot_change_the_cluster(make_scaler, scaler_server, cluster):
    from tests.servers.scaler_server import OTHER_API_KEY

    backend = make_scaler(api_key=OTHER_API_KEY)
    with pytest.raises(UnauthorizedError):
        backend.scale(cluster, 3, wait=False)
    assert desired(scaler_server, "ray", cluster.name) == 1


def test_cli_head_restart_with_a_lost_answer_is_sent_once_and_exits_6(scaler_env, scaler_server, cluster):
    from click.testing import CliRunner

    from flytekitplugins_ddlscale.cli import main

    scaler_server.inject_faults("drop", 5, path="/restart_head/", method="PATCH")
    result = CliRunner().invoke(main, ["restart-head", "--kind", "ray", "--name", cluster.name, "--timeout", "5"])
    assert result.exit_code == 6, result.output
    assert "not retried" in result.output
    assert scaler_server.count("PATCH", "/restart_head/") == 1


def test_service_gone_during_a_head_restart_wait_is_typed_with_last_state(make_scaler, scaler_server, proxy, cluster):
    backend = make_scaler(base_url=proxy.url, retries=RETRIES)
    scaler_server.head_recreate_delay = 5.0
    # Once the client polls the restart status, it has the service's answer to the restart itself.
    restarted = lambda: scaler_server.count("GET", "/restart_head_status/") > 0  # noqa: E731
    with When(restarted, proxy.go_down) as fault:
        with pytest.raises(ScalingTimeoutError) as caught:
            backend.restart_head(cluster, wait=True, timeout=3)
    assert fault.fired
    assert scaler_server.count("PATCH", "/restart_head/") == 1
    assert caught.value.state is not None


def test_scale_answer_lost_after_it_was_applied_is_safely_repeated(make_scaler, scaler_server, cluster):
    # The service applies the first PATCH after the client gave up on it; the retry sets the same
    # absolute count, so applying it twice changes nothing.
    backend = make_scaler(retries=RETRIES, timeout=0.3)
    scaler_server.inject_faults("delay", 1, delay=0.6, path="/scale/", method="PATCH")
    result = backend.scale(cluster, 3, wait=False)
    assert result.effective == 3
    time.sleep(0.6)
    assert set(scale_bodies(scaler_server, cluster.name)) == {3}
    assert desired(scaler_server, "ray", cluster.name) == 3


def test_a_hanging_service_does_not_stretch_a_wait_past_its_timeout(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=RETRIES, timeout=0.5)
    scaler_server.set_pod_ready_delay(30.0)
    backend.scale(cluster, 3, wait=False)
    scaler_server.clear_requests()
    scaler_server.inject_faults("delay", 50, delay=3.0, path="/cluster/")
    with pytest.raises(ScalingTimeoutError):
        backend.wait_for_workers(cluster, 3, timeout=0.25)
    assert scaler_server.count("GET", "/cluster/") == 1


def test_a_hanging_service_does_not_stretch_a_head_restart_wait_past_its_timeout(make_scaler, scaler_server, cluster):
    backend = make_scaler(retries=RETRIES, timeout=0.5)
    scaler_server.head_recreate_delay = 30.0
    scaler_server.inject_faults("delay", 50, delay=3.0, path="/restart_head_status/")
    with pytest.raises(ScalingTimeoutError):
        backend.restart_head(cluster, wait=True, timeout=0.25)
    assert scaler_server.count("PATCH", "/restart_head/") == 1
    assert scaler_server.count("GET", "/restart_head_status/") == 1
