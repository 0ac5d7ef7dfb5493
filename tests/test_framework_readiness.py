"""The framework readiness layer on its own: where the head is, what its JSON says, and waits
against Ray dashboard / Spark master test servers and a real Dask scheduler over real HTTP."""
import logging
import socket
import threading
import time

import pytest

from flytekitplugins_ddlscale.errors import InvalidInputError, ScalingTimeoutError, UnauthorizedError
from flytekitplugins_ddlscale._framework import PROBES, enabled_by_env, resolve_endpoint, wait_registered
from flytekitplugins_ddlscale._framework.endpoints import Endpoint
from flytekitplugins_ddlscale._framework.endpoints import configured_master, master_host, read_properties
from tests.framework_support import RealDask
from tests.servers.ray_dashboard import RayDashboardServer
from tests.servers.spark_master import SparkMasterServer
from tests.port_support import free_port
from tests.servers.status_http import StatusServer


def endpoint(kind, url):
    return Endpoint(kind, url, "test")


# ----- where the head is -----

def test_domino_variables_give_the_dashboard_ports():
    env = {"DASK_SCHEDULER_SERVICE_HOST": "dask-x-dask-scheduler", "RAY_HEAD_SERVICE_HOST": "ray-x-ray-head"}
    assert resolve_endpoint("dask", env=env).url == "http://dask-x-dask-scheduler:8787"
    assert resolve_endpoint("ray", env=env).url == "http://ray-x-ray-head:8265"
    env["DDLSCALE_RAY_DASHBOARD_PORT"] = "9265"
    assert resolve_endpoint("ray", env=env).url == "http://ray-x-ray-head:9265"
    assert resolve_endpoint("spark", env=env) is None
    assert resolve_endpoint("mpi", env=env) is None
    assert resolve_endpoint("dask", env={}) is None


def test_overrides_win_in_order():
    env = {"DASK_SCHEDULER_SERVICE_HOST": "h", "DDLSCALE_FRAMEWORK_URL": "http://generic:1/",
           "DDLSCALE_DASK_URL": "https://kind:2"}
    assert resolve_endpoint("dask", env=env).url == "https://kind:2"
    assert resolve_endpoint("ray", env=env).url == "http://generic:1"
    assert resolve_endpoint("dask", url="http://arg:3", env=env).source == "framework_url argument"


@pytest.mark.parametrize("bad", ["dask-host:8787", "ftp://h", "http://", "http://h:99999", 8787])
def test_bad_url_names_the_field(bad):
    with pytest.raises(InvalidInputError, match="framework_url"):
        resolve_endpoint("dask", url=bad, env={})


def test_bad_port_and_switch_values_name_the_variable():
    with pytest.raises(InvalidInputError, match="DDLSCALE_DASK_DASHBOARD_PORT"):
        resolve_endpoint("dask", env={"DASK_SCHEDULER_SERVICE_HOST": "h", "DDLSCALE_DASK_DASHBOARD_PORT": "http"})
    with pytest.raises(InvalidInputError, match="DDLSCALE_FRAMEWORK_READINESS"):
        enabled_by_env({"DDLSCALE_FRAMEWORK_READINESS": "maybe"})
    assert not enabled_by_env({"DDLSCALE_FRAMEWORK_READINESS": "OFF"})
    assert enabled_by_env({}) and enabled_by_env({"DDLSCALE_FRAMEWORK_READINESS": "on"})


def test_spark_master_from_the_spark_configuration(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "# preset by Domino\n! also a comment\nspark.driver.host   10.1.2.3\n"
        "spark.master        spark://spark-x-spark-master-0.spark-x-spark-master:7077\n"
    )
    env = {"SPARK_HOME": str(tmp_path)}
    found = resolve_endpoint("spark", env=env)
    assert found.url == "http://spark-x-spark-master-0.spark-x-spark-master:8080"
    assert "spark.master in" in found.source
    env["SPARK_MASTER_WEBUI_PORT"] = "8090"
    assert resolve_endpoint("spark", env=env).url.endswith(":8090")
    env["DDLSCALE_SPARK_WEBUI_PORT"] = "8091"
    assert resolve_endpoint("spark", env=env).url.endswith(":8091")
    # $SPARK_CONF_DIR replaces $SPARK_HOME/conf, as in Spark.
    other = tmp_path / "other"
    other.mkdir()
    (other / "spark-defaults.conf").write_text("spark.master=spark://other-master:7077\n")
    env["SPARK_CONF_DIR"] = str(other)
    assert resolve_endpoint("spark", env=env).url == "http://other-master:8091"
    env["SPARK_CONF_DIR"] = str(tmp_path / "missing")
    assert resolve_endpoint("spark", env=env) is None
    env["SPARK_MASTER"] = "spark://env-master:7077"
    assert resolve_endpoint("spark", env=env).source.startswith("$SPARK_MASTER")


def test_spark_master_url_forms():
    assert read_properties("a=1\nb: 2\nc  3\n d\n") == {"a": "1", "b": "2", "c": "3", "d": ""}
    assert master_host("spark://h1:7077,h2:7077") == "h1"
    assert master_host("spark://[fd00::1]:7077") == "fd00::1"
    assert master_host("spark://bare") == "bare"
    for no_ui in ("local[*]", "yarn", "k8s://https://api:6443"):
        assert master_host(no_ui) is None
    assert configured_master({}) is None
    assert resolve_endpoint("spark", env={"SPARK_MASTER": "local[2]"}) is None
    assert resolve_endpoint("spark", env={"SPARK_MASTER": "spark://[fd00::1]:7077"}).url == "http://[fd00::1]:8080"


# ----- the endpoints' JSON -----

def test_probes_count_only_alive_workers():
    ray = PROBES["ray"].count
    nodes = [{"state": "ALIVE", "is_head_node": True}, {"state": "ALIVE", "is_head_node": False},
             {"state": "DEAD", "is_head_node": False}]
    assert ray({"result": True, "msg": "", "data": {"result": {"total": 3, "result": nodes}}}) == 1
    legacy = [{"state": "ALIVE"}, {"state": "ALIVE"}, {"state": "ALIVE"}]
    assert ray({"result": True, "data": {"result": {"result": legacy}}}) == 2
    spark = PROBES["spark"].count
    assert spark({"aliveworkers": 2, "workers": []}) == 2
    assert spark({"workers": [{"state": "ALIVE"}, {"state": "DEAD"}]}) == 1
    assert PROBES["dask"].count({"workers": 3, "cores": 3}) == 3
    for probe, bad in ((PROBES["dask"], {"detail": "Not Found"}), (PROBES["ray"], {"result": False, "msg": "x"}),
                       (PROBES["spark"], ["html"])):
        with pytest.raises(ValueError):
            probe.count(bad)


# ----- waits over real HTTP -----

@pytest.mark.parametrize("server_class, kind", [(RayDashboardServer, "ray"), (SparkMasterServer, "spark")])
@pytest.mark.parametrize("legacy", [False, True])
def test_wait_returns_only_after_the_last_worker_joined(server_class, kind, legacy):
    with server_class(legacy=legacy) as server:
        server.join_after(0.3, 0.8, 1.4)
        seen = []
        done = wait_registered(endpoint(kind, server.url), 3, timeout=20, progress=seen.append)
        assert server.alive_count() == 3
        assert time.monotonic() >= server.last_join()
        assert done.workers == 3 and server.url in done.proof
        assert seen and seen[0].target == 3 and "3 workers registered with" in seen[0].what


def test_dead_workers_do_not_count():
    with RayDashboardServer() as server:
        server.join_after(0, 0)
        server.kill(1)
        server.join_after(0.5)
        wait_registered(endpoint("ray", server.url), 2, timeout=20)
        assert server.alive_count() == 2 and time.monotonic() >= server.last_join()


def test_wait_rides_out_a_head_outage(caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    with SparkMasterServer() as server:
        server.join_after(0.2, 2.0)
        time.sleep(0.3)
        server.outage(1.2)
        done = wait_registered(endpoint("spark", server.url), 2, timeout=30)
        assert done.workers == 2 and server.alive_count() == 2
    url = server.url
    assert caplog.text.count(f"the Spark master at {url} is unreachable") == 1
    assert caplog.text.count(f"the Spark master at {url} is reachable again after") == 1


def test_a_head_in_an_outage_refuses_connections_and_keeps_its_port_for_its_return():
    """The port is held during a staged outage: a busy machine gave it to another socket once, and the
    head could not come back (OSError: Address already in use)."""
    with SparkMasterServer() as server:
        port = int(server.url.rsplit(":", 1)[1])
        back = server.outage(1.0)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            with pytest.raises(OSError, match="in use"):
                other.bind(("127.0.0.1", port))
        finally:
            other.close()
        back.join(10)
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_unreachable_head_times_out_naming_what_it_waited_for():
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ScalingTimeoutError) as raised:
        wait_registered(Endpoint("dask", url, "$DASK_SCHEDULER_SERVICE_HOST, port 1"), 2,
                        timeout=1.0, cluster="dask/x")
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert f"2 workers registered with the Dask scheduler at {url}" in message
    assert "never answered" in message and "ConnectionRefusedError" in message and "dask/x" in message


def test_too_few_workers_times_out_with_the_last_count():
    with RayDashboardServer() as server:
        server.join_after(0)
        with pytest.raises(ScalingTimeoutError, match="1 registered at its last answer"):
            wait_registered(endpoint("ray", server.url), 2, timeout=0.8)


def test_refused_credentials_end_the_wait_at_once():
    class Guarded(StatusServer):
        def route(self, path, query):
            return 401, {"result": False, "msg": "Unauthorized"}, {}

    with Guarded() as server:
        started = time.monotonic()
        with pytest.raises(UnauthorizedError, match="HTTP 401"):
            wait_registered(endpoint("ray", server.url), 1, timeout=30)
        assert time.monotonic() - started < 10 and len(server.requests) == 1


SECRET = "ray-token-7f3a9c"


@pytest.mark.parametrize("where", ["variable", "file"])
def test_a_ray_head_with_token_authentication_gets_the_configured_token(where, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    if where == "variable":
        monkeypatch.setenv("RAY_AUTH_TOKEN", SECRET)
    else:
        monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
        (tmp_path / "token").write_text(SECRET + "\n")
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    with RayDashboardServer(token=SECRET) as server:
        server.join_after(0)
        assert wait_registered(endpoint("ray", server.url), 1, timeout=10).workers == 1


def test_a_ray_head_refusing_says_how_to_give_the_token_and_never_shows_it(monkeypatch):
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong-token-123")  # not sent: RAY_AUTH_MODE is not token
    with RayDashboardServer(token=SECRET) as server:
        with pytest.raises(UnauthorizedError, match="HTTP 401") as missing:
            wait_registered(endpoint("ray", server.url), 1, timeout=10)
        assert "no token was sent" in str(missing.value) and "RAY_AUTH_MODE=token" in str(missing.value)
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        with pytest.raises(UnauthorizedError, match="HTTP 403") as wrong:
            wait_registered(endpoint("ray", server.url), 1, timeout=10)
        assert "check it is this cluster's token" in str(wrong.value) and "wrong-token-123" not in str(wrong.value)


@pytest.mark.slow
def test_real_dask_scheduler_http_server(tmp_path):
    with RealDask(tmp_path) as dask:
        url = f"http://127.0.0.1:{dask.dashboard_port}"
        dask.add_worker(0.5)
        dask.add_worker(1.5)
        returned = []

        def wait():
            returned.append(wait_registered(endpoint("dask", url), 2, timeout=90))

        thread = threading.Thread(target=wait)
        thread.start()
        thread.join(120)
        assert returned and returned[0].workers == 2
        assert dask.registered() == 2
        assert resolve_endpoint("dask", env=dask.env()).url == url


def test_pod_readiness_and_framework_count_combine():
    """With a backend that sees pod readiness, the smaller of the two counts is ready."""
    from flytekitplugins_ddlscale.backends._base import BackendCapabilities
    from flytekitplugins_ddlscale._services.readiness import FrameworkOptions, ReadinessCheck
    from flytekitplugins_ddlscale.models import ClusterState
    from flytekitplugins_ddlscale.refs import ClusterRef

    class PodWatching:
        name = "kubernetes"
        capabilities = BackendCapabilities(frozenset({"ray"}), True, True, True, True)

    state = ClusterState("ray/x", "Running", desired_workers=3, existing_workers=3, ready_workers=2)
    with RayDashboardServer() as server:
        server.join_after(0, 0, 0)
        readiness = ReadinessCheck(PodWatching(), ClusterRef("ray", "x"), FrameworkOptions(url=server.url, env={})).ready(
            state, 2, 10
        )
    assert readiness.ready_workers == 2
    assert readiness.proof.startswith("2 worker pods Ready (kubernetes); 3 workers registered with the Ray head")
    off = ReadinessCheck(PodWatching(), ClusterRef("ray", "x"), FrameworkOptions(enabled=False, env={})).ready(state, 2, 10)
    assert off.proof == "2 worker pods Ready (kubernetes); framework check off"
    unknown = ReadinessCheck(PodWatching(), ClusterRef("ray", "x"), FrameworkOptions(env={})).ready(state, 2, 10)
    assert "head address unknown: set $RAY_HEAD_SERVICE_HOST, $DDLSCALE_RAY_URL" in unknown.proof


def test_idle_ray_workers_are_the_alive_ones_without_running_work():
    from flytekitplugins_ddlscale._framework.probes import idle_worker_ips

    with RayDashboardServer() as server:
        server.node("10.1.0.1", busy=True)
        server.node("10.1.0.2")
        server.node("10.1.0.3")
        assert idle_worker_ips(server.url, 5) == frozenset({"10.1.0.2", "10.1.0.3"})
        server.set_busy("10.1.0.3", True)
        assert idle_worker_ips(server.url, 5) == frozenset({"10.1.0.2"})
    assert idle_worker_ips(server.url, 1) is None  # no answer: unknown, not "none idle"


def test_a_truncated_or_foreign_ray_list_tells_nothing():
    from flytekitplugins_ddlscale._framework.probes import idle_worker_ips

    class Truncated(StatusServer):
        def route(self, path, query):
            node = {"node_id": "n1", "node_ip": "10.1.0.9", "is_head_node": False, "state": "ALIVE"}
            listing = {"total": 10001, "num_after_truncation": 10000, "num_filtered": 1, "result": [node]}
            return 200, {"result": True, "msg": "", "data": {"result": listing}}, {}

    class Foreign(StatusServer):
        def route(self, path, query):
            return 200, {"workers": 3}, {}

    for server_class in (Truncated, Foreign):
        with server_class() as server:
            assert idle_worker_ips(server.url, 5) is None
