"""Waits that ride out an outage of the scaler service or the Kubernetes API server.

The fault proxy refuses every connection (and cuts the open ones) for a few
seconds, as a restarting service or API server does, at a moment defined by
state (the scale was applied, the wait is polling or watching). Contract:

* an outage shorter than the operation's timeout is ridden out: the wait
  completes, a mutation refused before anything was sent is sent once
  afterwards, a head restart is never sent twice;
* each outage is logged exactly once when it starts and once when it ends;
* an outage longer than the timeout ends in ``ScalingTimeoutError`` that says
  how long the backend was unreachable, with the last state seen;
* 401/403 right after an outage (a restarted server's authorization caches
  are cold) are ridden out until the deadline, logged once; a 403 that does
  not follow an outage, and a 404, end the wait at once;
* a backend never reached (refused, name not resolved, TLS failing on first
  contact) is not an outage: ``NeverReachedError`` at once;
* an operation that does not wait rides out an outage for ``$DDLSCALE_NO_WAIT_LIMIT``
  seconds (30 by default), not its (wait) timeout.
"""
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Tuple

import pytest
from rel_helpers import When, polling, scale_bodies, select_kubernetes
from rel_proxy import FaultProxy

from flytekitplugins_ddlscale import (
    ClusterNotFoundError,
    ClusterRef,
    NeverReachedError,
    ScalingTimeoutError,
    UnauthorizedError,
)
from tests.servers.scaler_server import ScalerTestServer

pytestmark = pytest.mark.slow  # each outage lasts seconds of real time

OUTAGE = 3.0
"""Seconds the proxy refuses connections in the ride-through tests."""
TIMEOUT = 30.0
"""Timeout of operations that must ride out an outage of OUTAGE seconds."""
RAY = ClusterRef("ray", "ray-outage")
REFUSING = 2.0
"""Seconds a restarted server answers 403 after it listens again, in the cold-authorization tests."""
COLD_REFUSALS = 3
"""How many requests a restarted scaler service refuses (403) before its authorization is warm."""


def outage_lines(caplog: pytest.LogCaptureFixture) -> Tuple[List[str], List[str]]:
    """The plugin's "is unreachable" and "is reachable again" log lines; fails on per-attempt
    retry warnings of the HTTP library (the outage is to be logged once, not per attempt)."""
    assert not [r for r in caplog.records if r.name.startswith("urllib3") and r.levelno >= logging.WARNING]
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("flytekitplugins_ddlscale")]
    return [m for m in messages if " is unreachable " in m], [m for m in messages if " is reachable again " in m]


def assert_one_outage_logged(caplog: pytest.LogCaptureFixture) -> None:
    down, up = outage_lines(caplog)
    assert len(down) == 1 and len(up) == 1, (down, up)


def refusal_lines(caplog: pytest.LogCaptureFixture) -> List[str]:
    """The plugin's "answers HTTP 40x after its outage" log lines."""
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("flytekitplugins_ddlscale") and " after its outage " in r.getMessage()]


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    return caplog


# ======================= scaler service =======================


@pytest.fixture
def scaler_cluster(scaler_server: ScalerTestServer) -> ClusterRef:
    scaler_server.add_cluster("ray", RAY.name, replicas=1, max_replicas=6)
    return RAY


@pytest.fixture
def sproxy(scaler_server: ScalerTestServer) -> Iterator[FaultProxy]:
    with FaultProxy.before(scaler_server.url) as running:
        yield running


def restart_polled(server: ScalerTestServer) -> Callable[[], bool]:
    return lambda: server.count("GET", "/restart_head_status/") > 0


def test_scaler_scale_wait_rides_out_an_outage(make_scaler, scaler_server, sproxy, scaler_cluster, logs):
    backend = make_scaler(base_url=sproxy.url)
    scaler_server.set_pod_ready_delay(1.0)
    with When(polling(scaler_server, RAY.name), lambda: sproxy.outage(OUTAGE)) as fault:
        result = backend.scale(RAY, 4, wait=True, timeout=TIMEOUT)
    assert fault.fired and sproxy.up_at is not None
    assert result.final.existing_workers == 4
    assert scale_bodies(scaler_server, RAY.name) == [4]
    assert_one_outage_logged(logs)


def test_scaler_wait_for_workers_rides_out_an_outage(make_scaler, scaler_server, sproxy, scaler_cluster, logs):
    backend = make_scaler(base_url=sproxy.url)
    scaler_server.set_pod_ready_delay(1.0)
    backend.scale(RAY, 3, wait=False)
    scaler_server.clear_requests()
    polled = lambda: scaler_server.count("GET", "/cluster/") > 0  # noqa: E731
    with When(polled, lambda: sproxy.outage(OUTAGE)) as fault:
        state = backend.wait_for_workers(RAY, 3, timeout=TIMEOUT)
    assert fault.fired
    assert state.existing_workers == 3
    assert_one_outage_logged(logs)


def test_scaler_scale_refused_before_sending_is_sent_once_the_service_is_back(
    make_scaler, scaler_server, sproxy, scaler_cluster, logs
):
    backend = make_scaler(base_url=sproxy.url)
    backend.get_state(RAY)  # the baseline read; then the service goes away before the PATCH
    with When(lambda: True, lambda: sproxy.outage(OUTAGE)) as fault:
        time.sleep(0.2)
        result = backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.final.existing_workers == 3
    assert scale_bodies(scaler_server, RAY.name) == [3]
    assert_one_outage_logged(logs)


def test_scaler_patch_refused_at_connect_is_sent_once_the_service_is_back(scaler_server, sproxy, scaler_cluster):
    from flytekitplugins_ddlscale.backends.scaler._client import ScalerClient, ScalerOptions
    from flytekitplugins_ddlscale.backends._support.domino_auth import DominoAuth
    from flytekitplugins_ddlscale._core.waiting import Deadline
    from tests.servers.scaler_server import DEFAULT_API_KEY

    client = ScalerClient(sproxy.url, auth=DominoAuth(api_key=DEFAULT_API_KEY), options=ScalerOptions(retries=0))
    try:
        client.get_cluster(RAY)  # reached once: a refusal after this is an outage
        with When(lambda: True, lambda: sproxy.outage(1.5)) as fault:
            time.sleep(0.2)
            answer = client.scale(RAY, 3, None, Deadline(TIMEOUT))  # no retries left for anything sent
            restart = client.restart_head(RAY, Deadline(TIMEOUT))
    finally:
        client.close()
    assert fault.fired and sproxy.up_at is not None
    assert answer["effective_replicas"] == 3
    assert scale_bodies(scaler_server, RAY.name) == [3]
    assert restart["pod"] and scaler_server.count("PATCH", "/restart_head/") == 1


def test_scaler_restart_wait_rides_out_an_outage_and_restarts_once(
    make_scaler, scaler_server, sproxy, scaler_cluster, logs
):
    backend = make_scaler(base_url=sproxy.url)
    scaler_server.head_recreate_delay = 1.0
    with When(restart_polled(scaler_server), lambda: sproxy.outage(OUTAGE)) as fault:
        result = backend.restart_head(RAY, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.ready
    assert scaler_server.count("PATCH", "/restart_head/") == 1
    assert_one_outage_logged(logs)


def test_scaler_restart_refused_before_sending_is_sent_exactly_once(
    make_scaler, scaler_server, sproxy, scaler_cluster, logs
):
    backend = make_scaler(base_url=sproxy.url)
    backend.get_state(RAY)  # reached once: a refusal after this is an outage
    with When(lambda: True, lambda: sproxy.outage(OUTAGE)) as fault:
        time.sleep(0.2)
        result = backend.restart_head(RAY, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.ready
    assert scaler_server.count("PATCH", "/restart_head/") == 1
    assert_one_outage_logged(logs)


@pytest.mark.parametrize("status", [429, 503])
def test_scaler_overloaded_answers_beyond_the_retry_budget_are_ridden_out_in_a_wait(
    make_scaler, scaler_server, scaler_cluster, logs, status
):
    backend = make_scaler(retries=3)
    scaler_server.set_pod_ready_delay(0.5)
    burst = lambda: scaler_server.inject_faults("status", 8, status=status, path="/cluster/")  # noqa: E731
    with When(polling(scaler_server, RAY.name), burst) as fault:
        result = backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.final.existing_workers == 3
    assert sum(1 for r in scaler_server.requests if r.status == status) == 8  # twice the old budget of 1 + 3
    assert_one_outage_logged(logs)


def test_scaler_outage_longer_than_the_wait_is_a_timeout_naming_it(
    make_scaler, scaler_server, sproxy, scaler_cluster, logs
):
    backend = make_scaler(base_url=sproxy.url)
    scaler_server.set_pod_ready_delay(60.0)
    backend.scale(RAY, 3, wait=False)
    scaler_server.clear_requests()
    polled = lambda: scaler_server.count("GET", "/cluster/") > 0  # noqa: E731
    with When(polled, sproxy.go_down) as fault:
        with pytest.raises(ScalingTimeoutError) as caught:
            backend.wait_for_workers(RAY, 3, timeout=2.0)
    assert fault.fired
    text = str(caught.value)
    assert "scaler service" in text and "was unreachable for" in text and "(1 outage, still unreachable" in text
    assert caught.value.state is not None and caught.value.state.desired_workers == 3
    down, up = outage_lines(logs)
    assert len(down) == 1 and up == []


def test_scaler_two_outages_in_one_wait_are_both_counted(make_scaler, scaler_server, sproxy, scaler_cluster, logs):
    backend = make_scaler(base_url=sproxy.url)
    scaler_server.set_pod_ready_delay(60.0)
    backend.scale(RAY, 3, wait=False)
    scaler_server.clear_requests()
    polled = lambda: scaler_server.count("GET", "/cluster/") > 0  # noqa: E731

    def two_outages() -> None:
        sproxy.outage(0.8)
        time.sleep(2.5)  # longer than the longest pause between attempts (2 s), so one poll succeeds
        sproxy.go_down()

    with When(polled, two_outages) as fault:
        with pytest.raises(ScalingTimeoutError) as caught:
            backend.wait_for_workers(RAY, 3, timeout=6.0)
    assert fault.fired
    assert "(2 outages, still unreachable at the end)" in str(caught.value)
    down, up = outage_lines(logs)
    assert len(down) == 2 and len(up) == 1, (down, up)


def test_scaler_403_for_seconds_after_an_outage_is_ridden_out(make_scaler, scaler_server, sproxy, scaler_cluster, logs):
    backend = make_scaler(base_url=sproxy.url)
    scaler_server.set_pod_ready_delay(1.0)

    def restart_with_cold_authorization() -> None:
        # The server that comes back refuses its first requests (counted, not timed: under load a wait
        # may poll only once in a window of seconds, and the claim is that it rides out several).
        sproxy.go_down()
        scaler_server.inject_faults("status", COLD_REFUSALS, status=403, path="/cluster/")
        time.sleep(1.0)
        sproxy.come_up()

    with When(polling(scaler_server, RAY.name), restart_with_cold_authorization) as fault:
        result = backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.final.existing_workers == 3
    assert sum(1 for r in scaler_server.requests if r.status == 403) == COLD_REFUSALS  # the wait met every refusal
    assert scale_bodies(scaler_server, RAY.name) == [3]
    assert_one_outage_logged(logs)
    assert len(refusal_lines(logs)) == 1, refusal_lines(logs)


def test_scaler_403_after_an_outage_that_persists_ends_at_the_deadline(
    make_scaler, scaler_server, sproxy, scaler_cluster, logs
):
    backend = make_scaler(base_url=sproxy.url)
    scaler_server.set_pod_ready_delay(60.0)

    def outage_then_refused() -> None:
        sproxy.go_down()
        scaler_server.inject_faults("status", 10_000, status=403, path="/cluster/")
        time.sleep(0.5)
        sproxy.come_up()

    with When(polling(scaler_server, RAY.name), outage_then_refused) as fault:
        with pytest.raises(UnauthorizedError):
            backend.scale(RAY, 3, wait=True, timeout=4.0)
    assert fault.fired
    assert sum(1 for r in scaler_server.requests if r.status == 403) >= 2
    down, up = outage_lines(logs)
    assert len(down) == 1 and up == [] and len(refusal_lines(logs)) == 1


def test_scaler_403_without_an_outage_ends_the_wait_at_once(make_scaler, scaler_server, scaler_cluster, logs):
    backend = make_scaler()
    scaler_server.set_pod_ready_delay(60.0)
    refuse = lambda: scaler_server.inject_faults("status", 10_000, status=403, path="/cluster/")  # noqa: E731
    with When(polling(scaler_server, RAY.name), refuse) as fault:
        with pytest.raises(UnauthorizedError):
            backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)  # a ride would be ScalingTimeoutError at 30 s
    assert fault.fired
    assert sum(1 for r in scaler_server.requests if r.status == 403) == 1
    assert outage_lines(logs) == ([], []) and refusal_lines(logs) == []


def test_scaler_proxy_token_fetch_after_a_restart_is_ridden_out(
    scaler_server, sproxy, scaler_env, scaler_cluster, monkeypatch, logs
):
    from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend

    for name in ("DOMINO_API_KEY", "DOMINO_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOMINO_API_PROXY", sproxy.url)
    backend = ScalerServiceBackend(base_url=sproxy.url, tier_catalog=None)
    scaler_server.set_pod_ready_delay(1.0)

    def restart_with_a_cold_proxy() -> None:
        sproxy.go_down()
        scaler_server.expire_tokens()  # the cached token is refused once the service is back ...
        scaler_server.inject_faults("status", 3, status=503, path="/access-token")  # ... and a new one is late
        time.sleep(1.0)
        sproxy.come_up()

    try:
        with When(polling(scaler_server, RAY.name), restart_with_a_cold_proxy) as fault:
            result = backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)
    finally:
        backend.close()
    assert fault.fired
    assert result.final.existing_workers == 3
    assert sum(1 for r in scaler_server.requests if r.path == "/access-token" and r.status == 503) == 3
    assert_one_outage_logged(logs)


@pytest.mark.parametrize("wait", [True, False])
def test_scaler_final_state_read_after_a_head_restart_rides_out_an_outage(
    make_scaler, scaler_server, scaler_cluster, logs, wait
):
    backend = make_scaler(retries=3)
    # The read before the restart takes 4 (1 + 3 retries, best effort); the final read meets the other 6.
    scaler_server.inject_faults("status", 10, status=503, path="/cluster/", method="GET")
    result = backend.restart_head(RAY, wait=wait, timeout=TIMEOUT)
    assert result.final.cluster == str(RAY)
    assert scaler_server.count("PATCH", "/restart_head/") == 1
    assert sum(1 for r in scaler_server.requests if r.status == 503) == 10


def test_scaler_never_reached_fails_at_once(make_scaler, scaler_cluster, logs):
    backend = make_scaler(base_url=f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(NeverReachedError) as caught:
        backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)  # riding it out would be ScalingTimeoutError
    assert not isinstance(caught.value, ScalingTimeoutError)
    assert "has not answered once" in str(caught.value) and "Connection refused" in str(caught.value)
    assert outage_lines(logs) == ([], [])


def test_scaler_name_not_resolved_fails_at_once(make_scaler, scaler_cluster):
    backend = make_scaler(base_url="http://ddlscale-no-such-host.invalid")
    with pytest.raises(NeverReachedError) as caught:
        backend.wait_for_workers(RAY, 1, timeout=TIMEOUT)
    assert "has not answered once" in str(caught.value)


def test_scaler_tls_failing_on_first_contact_fails_at_once(make_scaler, scaler_server, scaler_cluster):
    # https:// to a plain-HTTP port: the TLS handshake fails (wrong version number) on every attempt.
    backend = make_scaler(base_url=scaler_server.url.replace("http://", "https://"), verify=False)
    with pytest.raises(NeverReachedError) as caught:
        backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)
    assert "has not answered once" in str(caught.value) and "SSL" in str(caught.value)
    assert scale_bodies(scaler_server, RAY.name) == []


def test_scaler_reset_on_first_contact_is_ridden_out(make_scaler, scaler_server, sproxy, scaler_cluster):
    sproxy.reset_next(2)  # something accepted the connection: a proxy whose service restarts, not a wrong address
    result = make_scaler(base_url=sproxy.url).scale(RAY, 3, wait=True, timeout=TIMEOUT)
    assert result.final.existing_workers == 3 and sproxy.accepted >= 3


def test_scaler_no_wait_rides_out_an_outage_for_its_own_bound_not_the_timeout(
    make_scaler, scaler_server, sproxy, scaler_cluster, monkeypatch
):
    # The bound is $DDLSCALE_NO_WAIT_LIMIT (30 s by default): 4 s here, so the test does not sit out 30 s.
    limit = 4
    monkeypatch.setenv("DDLSCALE_NO_WAIT_LIMIT", str(limit))
    backend = make_scaler(base_url=sproxy.url)
    backend.get_state(RAY)
    sproxy.go_down()
    back = threading.Timer(limit + 15, sproxy.come_up)  # old behaviour: ridden out until then
    back.start()
    try:
        with pytest.raises(ScalingTimeoutError) as caught:
            backend.scale(RAY, 3, wait=False)  # the default (wait) timeout is 900 s
    finally:
        back.cancel()
    assert f"timed out after {limit:g}s" in str(caught.value) and "was unreachable for" in str(caught.value)
    assert scale_bodies(scaler_server, RAY.name) == []


def test_the_no_wait_limit_defaults_to_30_s_and_a_bad_value_is_refused_before_anything_is_sent(
    make_scaler, scaler_server, scaler_cluster, monkeypatch
):
    from flytekitplugins_ddlscale._core.outage import NO_WAIT_LIMIT, no_wait_limit
    from flytekitplugins_ddlscale.errors import InvalidInputError

    monkeypatch.delenv("DDLSCALE_NO_WAIT_LIMIT", raising=False)
    assert no_wait_limit() == NO_WAIT_LIMIT == 30.0
    monkeypatch.setenv("DDLSCALE_NO_WAIT_LIMIT", "soon")
    with pytest.raises(InvalidInputError, match="DDLSCALE_NO_WAIT_LIMIT"):
        make_scaler().scale(RAY, 3, wait=False)
    assert scale_bodies(scaler_server, RAY.name) == []


def test_scaler_cluster_deleted_during_an_outage_is_not_found_at_once(
    make_scaler, scaler_server, sproxy, scaler_cluster
):
    backend = make_scaler(base_url=sproxy.url)
    scaler_server.set_pod_ready_delay(60.0)

    def outage_and_delete() -> None:
        sproxy.go_down()
        scaler_server.remove_cluster("ray", RAY.name)
        time.sleep(1.0)
        sproxy.come_up()

    with When(polling(scaler_server, RAY.name), outage_and_delete) as fault:
        with pytest.raises(ClusterNotFoundError):
            backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)
    assert fault.fired


def test_scaler_phase_reconciles_ride_out_outages(scaler_server, sproxy, scaler_env, scaler_cluster, monkeypatch, logs):
    from flytekitplugins_ddlscale.phase import cluster_phase

    monkeypatch.setenv("CLUSTER_SCALER_BASE_URL", sproxy.url)
    scaler_server.set_pod_ready_delay(1.0)
    with When(polling(scaler_server, RAY.name), lambda: sproxy.outage(OUTAGE)) as up_fault:
        with cluster_phase(f"ray/{RAY.name}", 3, timeout=TIMEOUT, framework_ready=False, deck=False,
                           reassert_interval=None):
            assert scaler_server.cluster_object("ray", RAY.name)["spec"]["worker"]["replicas"] == 3
            scaler_server.clear_requests()
            down_fault = When(polling(scaler_server, RAY.name), lambda: sproxy.outage(OUTAGE)).__enter__()
    down_fault.__exit__(None, None, None)
    assert up_fault.fired and down_fault.fired
    assert scale_bodies(scaler_server, RAY.name) == [1]
    assert scaler_server.cluster_object("ray", RAY.name)["spec"]["worker"]["replicas"] == 1
    down, up = outage_lines(logs)
    assert len(down) == 2 and len(up) == 2, (down, up)


# ======================= Kubernetes API server =======================

K8S_AUTOSCALING = {"minReplicas": 1, "maxReplicas": 6}


@pytest.fixture
def k8s_cluster(k8s_server: Any) -> ClusterRef:
    k8s_server.add_cluster("ray", RAY.name, replicas=1, autoscaling=dict(K8S_AUTOSCALING))
    return RAY


@pytest.fixture
def kproxy(k8s_server: Any) -> Iterator[FaultProxy]:
    with FaultProxy.before(k8s_server.url) as running:
        yield running


@pytest.fixture
def k8s_backend(kproxy: FaultProxy, tiers_file: Path, clean_env: Path) -> Iterator[Any]:
    """A Kubernetes backend whose API server is behind the fault proxy."""
    from kubernetes import client as k8s_client

    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
    from flytekitplugins_ddlscale.backends.tiers import FileTierCatalog

    api = k8s_client.ApiClient(k8s_client.Configuration(host=kproxy.url))
    backend = KubernetesBackend(api_client=api, failure_grace=0.3, tier_catalog=FileTierCatalog(tiers_file))
    yield backend
    backend.close()
    api.close()


def watching(server: Any) -> Callable[[], bool]:
    return lambda: any(r.query.get("watch") == "true" for r in server.requests)


def cluster_patches(server: Any) -> int:
    return sum(1 for r in server.requests if r.method == "PATCH" and r.status == 200)


def test_k8s_scale_wait_rides_out_an_outage(k8s_server, kproxy, k8s_backend, k8s_cluster, logs):
    k8s_server.set_ready_delay(1.0)
    with When(watching(k8s_server), lambda: kproxy.outage(OUTAGE)) as fault:
        result = k8s_backend.scale(RAY, 4, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.final.ready_workers == 4
    assert cluster_patches(k8s_server) == 1
    assert_one_outage_logged(logs)


def test_k8s_wait_for_workers_rides_out_an_outage(k8s_server, kproxy, k8s_backend, k8s_cluster, logs):
    k8s_server.set_ready_delay(1.0)
    k8s_backend.scale(RAY, 3, wait=False)
    k8s_server.clear_log()
    with When(watching(k8s_server), lambda: kproxy.outage(OUTAGE)) as fault:
        state = k8s_backend.wait_for_workers(RAY, 3, timeout=TIMEOUT)
    assert fault.fired
    assert state.ready_workers == 3
    assert_one_outage_logged(logs)


def test_k8s_scale_refused_before_sending_is_applied_once_the_server_is_back(
    k8s_server, kproxy, k8s_backend, k8s_cluster, logs
):
    k8s_backend.get_state(RAY)
    with When(lambda: True, lambda: kproxy.outage(OUTAGE)) as fault:
        time.sleep(0.2)
        result = k8s_backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.final.ready_workers == 3
    assert cluster_patches(k8s_server) == 1
    assert_one_outage_logged(logs)


def test_k8s_patch_refused_at_connect_is_sent_once_the_server_is_back(k8s_server, kproxy, k8s_cluster):
    from kubernetes import client as k8s_client

    from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION
    from flytekitplugins_ddlscale.backends.kubernetes._api import KubeApi, Resource
    from flytekitplugins_ddlscale._core.waiting import Deadline

    api = KubeApi(k8s_client.ApiClient(k8s_client.Configuration(host=kproxy.url)))
    try:
        rays = Resource("rayclusters", CRD_GROUP, CRD_VERSION)
        version = api.read_object(rays, "domino-compute", RAY.name)["metadata"]["resourceVersion"]
        patch = {"metadata": {"resourceVersion": version}, "spec": {"worker": {"replicas": 2}}}
        with When(lambda: True, lambda: kproxy.outage(1.5)) as fault:
            time.sleep(0.2)
            after = api.patch_object(rays, "domino-compute", RAY.name, patch, Deadline(TIMEOUT))
    finally:
        api.close()
    assert fault.fired
    assert after["spec"]["worker"]["replicas"] == 2
    assert [r.status for r in k8s_server.requests if r.method == "PATCH"] == [200]


def test_k8s_restart_wait_rides_out_an_outage_and_deletes_once(k8s_server, kproxy, k8s_backend, k8s_cluster, logs):
    k8s_server.set_ready_delay(1.0)
    with When(watching(k8s_server), lambda: kproxy.outage(OUTAGE)) as fault:
        result = k8s_backend.restart_head(RAY, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.ready
    assert k8s_server.count("DELETE") == 1
    assert_one_outage_logged(logs)


def test_k8s_restart_refused_before_sending_deletes_exactly_once(k8s_server, kproxy, k8s_backend, k8s_cluster, logs):
    k8s_backend.get_state(RAY)  # reached once: a refusal after this is an outage
    with When(lambda: True, lambda: kproxy.outage(OUTAGE)) as fault:
        time.sleep(0.2)
        result = k8s_backend.restart_head(RAY, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.ready
    assert k8s_server.count("DELETE") == 1
    assert_one_outage_logged(logs)


def test_k8s_outage_longer_than_the_wait_is_a_timeout_naming_it(k8s_server, kproxy, k8s_backend, k8s_cluster, logs):
    k8s_server.set_ready_delay(60.0)
    k8s_backend.scale(RAY, 3, wait=False)
    k8s_server.clear_log()
    with When(watching(k8s_server), kproxy.go_down) as fault:
        with pytest.raises(ScalingTimeoutError) as caught:
            k8s_backend.wait_for_workers(RAY, 3, timeout=2.0)
    assert fault.fired
    text = str(caught.value)
    assert "Kubernetes API server" in text and "was unreachable for" in text and "(1 outage, still unreachable" in text
    assert caught.value.state is not None and caught.value.state.desired_workers == 3
    down, up = outage_lines(logs)
    assert len(down) == 1 and up == []


def test_k8s_scale_whose_server_never_comes_back_is_a_timeout_and_changes_nothing(
    k8s_server, kproxy, k8s_backend, k8s_cluster
):
    k8s_backend.get_state(RAY)
    kproxy.go_down()
    with pytest.raises(ScalingTimeoutError) as caught:
        k8s_backend.scale(RAY, 3, wait=True, timeout=1.5)
    assert "was unreachable for" in str(caught.value)
    assert cluster_patches(k8s_server) == 0
    assert k8s_server.get_object("ray", RAY.name)["spec"]["worker"]["replicas"] == 1


def test_k8s_403_for_seconds_after_an_outage_is_ridden_out(k8s_server, kproxy, k8s_backend, k8s_cluster, logs):
    k8s_server.set_ready_delay(1.0)

    def restart_with_cold_authorization() -> None:
        kproxy.go_down()
        # Cold authorization refuses every verb the backend uses (the wait watches the cluster objects too).
        for verb in ("get", "list", "watch"):
            k8s_server.forbid(verb, "rayclusters")
        k8s_server.forbid("list", "pods")
        k8s_server.forbid("watch", "pods")
        time.sleep(1.0)
        kproxy.come_up()
        time.sleep(REFUSING)
        k8s_server.allow_all()

    with When(watching(k8s_server), restart_with_cold_authorization) as fault:
        result = k8s_backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.final.ready_workers == 3
    assert any(r.status == 403 for r in k8s_server.requests)
    assert cluster_patches(k8s_server) == 1
    assert_one_outage_logged(logs)
    assert len(refusal_lines(logs)) == 1, refusal_lines(logs)


def test_k8s_403_on_the_first_request_of_an_operation_fails_at_once(k8s_server, k8s_backend, k8s_cluster, logs):
    k8s_backend.get_state(RAY)  # the server has served this process
    k8s_server.forbid("get", "rayclusters")
    with pytest.raises(UnauthorizedError):
        k8s_backend.wait_for_workers(RAY, 1, timeout=TIMEOUT)  # a ride would be UnauthorizedError at 30 s
    assert sum(1 for r in k8s_server.requests if r.status == 403) == 1
    assert refusal_lines(logs) == [] and outage_lines(logs) == ([], [])


COLD_AUTHORIZATION = [("get", "rayclusters"), ("list", "rayclusters"), ("watch", "rayclusters"),
                      ("list", "pods"), ("watch", "pods")]
"""What a restarted API server refuses while its authorization warms up (everything: a poll's reads of
the cluster object and its pods, from the server or the shared caches' lists and watches)."""


def _k8s_connector_scale(k8s_server: Any, kproxy: Any, tiers_file: Path, tmp_path: Path, monkeypatch: Any) -> Any:
    """A connector service and the metadata of its create: scale the Ray cluster to 3 through ``kproxy``."""
    from collections import OrderedDict

    from flytekit.tools.translator import get_serializable

    from flytekitplugins_ddlscale._services.connector_core import ScalingService
    from flytekitplugins_ddlscale._services.connector_policy import ConnectorPolicy
    from tests.connector_fault_support import FAULT_SCALE
    from tests.contract_support import write_kubeconfig
    from tests.test_connector_service import SETTINGS

    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", kproxy.url)))
    monkeypatch.setenv("DDLSCALE_TIERS_FILE", str(tiers_file))
    monkeypatch.setenv("DDLSCALE_FRAMEWORK_READINESS", "off")
    k8s_server.set_ready_delay(0.3)
    template = get_serializable(OrderedDict(), SETTINGS, FAULT_SCALE).template
    custom = dict(template.custom, cluster=f"ray/{RAY.name}", backend="kubernetes", timeout=60.0, framework_url=None)
    service = ScalingService(ConnectorPolicy.from_env())
    meta = service.create(template.type, custom, {})
    assert meta.error == "" and meta.target == 3
    return service, meta


def _poll_while(service: Any, meta: Any, state: str) -> Any:
    """The first poll (one per resync) whose state is not ``state``, or the last one after TIMEOUT."""
    end = time.monotonic() + TIMEOUT
    while (poll := service.poll(meta)).state == state and time.monotonic() < end:
        time.sleep(0.1)  # a resync
    return poll


def test_k8s_connector_poll_takes_a_403_right_after_an_outage_for_the_restart(
    k8s_server, kproxy, k8s_cluster, tiers_file, clean_env, tmp_path, monkeypatch
):
    """A connector's poll reads once (no deadline): the restarted server's 403 must leave the node
    RUNNING, to be read again at the next resync. The outage starts before the first poll, so only
    the create has been served (creates and polls share the connector's kept backend)."""
    from flytekitplugins_ddlscale._services.connector_core import RUNNING, SUCCEEDED

    service, meta = _k8s_connector_scale(k8s_server, kproxy, tiers_file, tmp_path, monkeypatch)
    kproxy.go_down()
    assert service.poll(meta).state == RUNNING  # connections refused
    for verb, resource in COLD_AUTHORIZATION:  # back, its authorization cold (for every read the poll makes)
        k8s_server.forbid(verb, resource)
    kproxy.come_up()
    cold = service.poll(meta)
    assert cold.state == RUNNING, cold.message
    assert "answered HTTP 403 right after its outage" in cold.message
    k8s_server.allow_all()
    poll = _poll_while(service, meta, RUNNING)
    assert poll.state == SUCCEEDED, poll.message
    assert (poll.outcome.previous_workers, poll.outcome.workers) == (1, 3)


def test_k8s_connector_poll_fails_on_a_403_without_an_outage_naming_the_permission(
    k8s_server, kproxy, k8s_cluster, tiers_file, clean_env, tmp_path, monkeypatch
):
    """A 403 from a server that had no outage is the missing permission: the node is FAILED at once,
    naming it, even where the poll was answered from the shared cache until then. (An outage shortly
    before would make the 403 the restart's for WARMUP_WINDOW seconds: the test above.)"""
    from flytekitplugins_ddlscale._services.connector_core import FAILED, RUNNING, SUCCEEDED

    service, meta = _k8s_connector_scale(k8s_server, kproxy, tiers_file, tmp_path, monkeypatch)
    poll = _poll_while(service, meta, RUNNING)
    assert poll.state == SUCCEEDED, poll.message
    for verb in ("get", "list", "watch"):
        k8s_server.forbid(verb, "rayclusters")
    # The cache's watch ends as a watch timeout ends it and, re-opened, is refused: the poll reads the
    # server. (A cut watch would look like a restarting server, its 403 ridden out for a while.)
    k8s_server.end_watches()
    denied = _poll_while(service, meta, SUCCEEDED)
    assert denied.state == FAILED, denied.message
    assert "Kubernetes refused to get rayclusters" in denied.message and "(RBAC)" in denied.message
    assert any(r.status == 403 for r in k8s_server.requests)


def test_k8s_never_reached_fails_at_once(tiers_file, clean_env, logs):
    from kubernetes import client as k8s_client

    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
    from flytekitplugins_ddlscale.backends.tiers import FileTierCatalog

    api = k8s_client.ApiClient(k8s_client.Configuration(host=f"http://127.0.0.1:{closed_port()}"))
    backend = KubernetesBackend(api_client=api, tier_catalog=FileTierCatalog(tiers_file))
    try:
        with pytest.raises(NeverReachedError) as caught:
            backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)  # riding it out would be ScalingTimeoutError
    finally:
        backend.close()
        api.close()
    assert not isinstance(caught.value, ScalingTimeoutError)
    assert "Kubernetes API server" in str(caught.value) and "has not answered once" in str(caught.value)
    assert outage_lines(logs) == ([], [])


def test_k8s_release_during_an_outage_rides_it_out(k8s_server, kproxy, k8s_backend, k8s_cluster, logs):
    k8s_backend.claim(RAY, "phase-a", 3)
    with When(lambda: True, lambda: kproxy.outage(OUTAGE)) as fault:
        time.sleep(0.2)
        assert k8s_backend.release(RAY, "phase-a") is None
    assert fault.fired
    assert k8s_backend.claims(RAY) == {}
    assert_one_outage_logged(logs)


def test_k8s_cluster_deleted_during_an_outage_is_not_found_at_once(k8s_server, kproxy, k8s_backend, k8s_cluster):
    k8s_server.set_ready_delay(60.0)

    def outage_and_delete() -> None:
        kproxy.go_down()
        k8s_server.commit("rayclusters", "domino-compute", None, RAY.name, "DELETED")
        time.sleep(1.0)
        kproxy.come_up()

    with When(watching(k8s_server), outage_and_delete) as fault:
        with pytest.raises(ClusterNotFoundError):
            k8s_backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)
    assert fault.fired


def test_k8s_phase_reconciles_ride_out_outages(k8s_server, kproxy, k8s_cluster, tiers_file, clean_env, tmp_path,
                                               monkeypatch, logs):
    from flytekitplugins_ddlscale.phase import cluster_phase

    select_kubernetes(monkeypatch, tmp_path / "kubeconfig-proxy", kproxy.url, tiers_file)
    k8s_server.set_ready_delay(1.0)
    with When(watching(k8s_server), lambda: kproxy.outage(OUTAGE)) as up_fault:
        with cluster_phase(f"ray/{RAY.name}", 3, timeout=TIMEOUT, framework_ready=False, deck=False):
            assert k8s_server.ready_workers(RAY.name) == 3
            k8s_server.clear_log()
            # Scaling down needs no watch (the pods go at once): the outage starts with the release,
            # so the release and the restore's reconcile both have to ride it out.
            released = lambda: k8s_server.count("PATCH") > 0  # noqa: E731
            down_fault = When(released, lambda: kproxy.outage(OUTAGE)).__enter__()
    down_fault.__exit__(None, None, None)
    assert up_fault.fired and down_fault.fired
    spec = k8s_server.get_object("ray", RAY.name)["spec"]
    assert spec["worker"]["replicas"] == 1 and spec["autoscaling"] == K8S_AUTOSCALING
    down, up = outage_lines(logs)
    assert len(down) == 2 and len(up) == 2, (down, up)


# ======================= TLS =======================


@pytest.fixture
def tls_sproxy(scaler_server: ScalerTestServer, tmp_path: Path) -> Iterator[FaultProxy]:
    """The scaler test server behind TLS with a self-signed certificate for 127.0.0.1."""
    from rel_tls import self_signed_cert, server_context

    cert, key = self_signed_cert(tmp_path)
    with FaultProxy.before(scaler_server.url, tls=server_context(cert, key)) as proxy:
        yield proxy


def test_scaler_tls_handshakes_failing_during_a_restart_are_ridden_out(
    make_scaler, scaler_server, tls_sproxy, scaler_cluster, logs
):
    backend = make_scaler(base_url=tls_sproxy.url, verify=False)
    scaler_server.set_pod_ready_delay(1.0)

    def restarting() -> None:
        tls_sproxy.reset_next(5)  # the next handshakes are reset, as by a proxy whose backend restarts
        tls_sproxy.cut_all()

    with When(polling(scaler_server, RAY.name), restarting) as fault:
        result = backend.scale(RAY, 4, wait=True, timeout=TIMEOUT)
    assert fault.fired
    assert result.final.existing_workers == 4
    assert scale_bodies(scaler_server, RAY.name) == [4]
    assert_one_outage_logged(logs)


def test_scaler_certificate_refused_is_final_not_ridden_out(make_scaler, scaler_server, tls_sproxy, scaler_cluster):
    from flytekitplugins_ddlscale import AccessError, CertificateRefusedError, TransientError

    backend = make_scaler(base_url=tls_sproxy.url)  # verifies the self-signed certificate: refused
    with pytest.raises(CertificateRefusedError) as caught:
        backend.scale(RAY, 3, wait=True, timeout=TIMEOUT)  # riding it out would end in ScalingTimeoutError
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    assert isinstance(caught.value, AccessError) and not isinstance(caught.value, TransientError)  # not worth a retry
    assert scaler_server.requests == []
