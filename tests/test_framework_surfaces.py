"""Every surface waits for the framework, not just the pods: ScaleCluster / WaitForCluster nodes
(flytekit local execution), ``ddlscale scale|status --wait`` (a real subprocess), phases and the
connector, with the scaler backend on its test server reporting pods before the workers join.

Workers join a real Dask scheduler, or the Ray dashboard / Spark master test servers, seconds
after the scaler test server lists their pods; each surface must return only after the last one
joined, as the framework itself counts it at return time.
"""
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flyteidl.core.execution_pb2 import TaskExecution

from flytekitplugins_ddlscale.connector import ScalingConnector
from flytekitplugins_ddlscale.errors import ScalingTimeoutError
from flytekitplugins_ddlscale.phase import cluster_phase
from flytekitplugins_ddlscale.tasks import SCALE_TASK_TYPE, ScaleCluster, WaitForCluster
from tests.framework_support import RealDask, use_scaler
from tests.servers.ray_dashboard import RayDashboardServer
from tests.servers.scaler_server import ScalerTestServer
from tests.servers.spark_master import SparkMasterServer
from tests.port_support import free_port

POD_DELAY = 0.4
"""Seconds until the scaler test server lists a new worker pod."""
DDLSCALE = str(Path(sys.executable).parent / "ddlscale")


@pytest.fixture
def scaler(tmp_path, monkeypatch):
    """The scaler test server with one 0-worker cluster per kind, selected through the environment."""
    with ScalerTestServer(pod_ready_delay=POD_DELAY) as server:
        for kind in ("dask", "ray", "spark"):
            server.add_cluster(kind, f"{kind}-fw", replicas=0, max_replicas=4, min_replicas=None)
        use_scaler(monkeypatch, server, tmp_path / "state")
        yield server


def head_env(kind, server, tmp_path):
    """What a Domino run with a ``kind`` cluster has, pointed at ``server``."""
    if kind == "ray":
        return {"RAY_HEAD_SERVICE_HOST": "127.0.0.1", "RAY_HEAD_SERVICE_PORT": "10001",
                "DDLSCALE_RAY_DASHBOARD_PORT": str(server.port)}
    conf = tmp_path / "spark-conf"
    conf.mkdir(exist_ok=True)
    (conf / "spark-defaults.conf").write_text("spark.master spark://127.0.0.1:7077\nspark.driver.host 127.0.0.1\n")
    return {"SPARK_CONF_DIR": str(conf), "DDLSCALE_SPARK_WEBUI_PORT": str(server.port)}


def set_env(monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def cli(*args):
    """``ddlscale`` as a Domino Flows step runs it: a separate process with this environment."""
    return subprocess.run([DDLSCALE, *args], capture_output=True, text=True, timeout=180, env=dict(os.environ))


SERVERS = {"ray": RayDashboardServer, "spark": SparkMasterServer}


# ----- real Dask -----

@pytest.fixture
def dask(tmp_path, scaler, monkeypatch):
    with RealDask(tmp_path) as real:
        set_env(monkeypatch, real.env())
        yield real


@pytest.mark.slow
def test_scale_node_returns_after_the_last_dask_worker_joined(dask):
    dask.add_worker(POD_DELAY + 0.5)
    dask.add_worker(POD_DELAY + 2.0)
    outcome = ScaleCluster("up_dask", cluster="dask/dask-fw", replicas=2, timeout=120)()
    assert dask.registered() == 2
    assert outcome.ready_workers == 2 and outcome.waited
    assert f"2 workers registered with the Dask scheduler at http://127.0.0.1:{dask.dashboard_port}" in outcome.readiness
    assert "worker pods exist (scaler; pod readiness not visible)" in outcome.readiness


@pytest.mark.slow
def test_cli_scale_wait_returns_after_the_last_dask_worker_joined(dask):
    dask.add_worker(POD_DELAY + 0.5)
    dask.add_worker(POD_DELAY + 2.0)
    done = cli("scale", "--kind", "dask", "--name", "dask-fw", "--replicas", "2", "--timeout", "120", "--json")
    registered = dask.registered()
    assert done.returncode == 0, done.stderr
    assert registered == 2
    result = json.loads(done.stdout)
    assert result["final"]["ready_workers"] == 2
    assert "2 workers registered with the Dask scheduler" in result["readiness"]


@pytest.mark.slow
def test_phase_body_starts_after_the_last_dask_worker_joined(dask):
    dask.add_worker(POD_DELAY + 0.5)
    dask.add_worker(POD_DELAY + 2.0)
    with cluster_phase("dask/dask-fw", 2, timeout=120, reassert_interval=None, deck=False) as phase:
        assert dask.registered() == 2
        assert "2 workers registered with the Dask scheduler" in phase.framework_check
        # The restore to 0 waits until the scheduler dropped them: their processes end with their pods.
        dask.stop_workers()
    assert dask.registered() == 0


# ----- Ray dashboard and Spark master -----

@pytest.mark.parametrize("kind", ["ray", "spark"])
@pytest.mark.parametrize("surface", ["node", "cli", "phase"])
def test_surfaces_return_after_the_last_worker_joined(kind, surface, scaler, tmp_path, monkeypatch):
    with SERVERS[kind]() as head:
        set_env(monkeypatch, head_env(kind, head, tmp_path))
        head.join_after(POD_DELAY + 0.5, POD_DELAY + 1.0, POD_DELAY + 1.8)
        if surface == "node":
            outcome = ScaleCluster(f"up_{kind}", cluster=f"{kind}/{kind}-fw", replicas=3, timeout=60)()
            proof, ready = outcome.readiness, outcome.ready_workers
        elif surface == "cli":
            done = cli("scale", "--kind", kind, "--name", f"{kind}-fw", "--replicas", "3", "--timeout", "60", "--json")
            assert done.returncode == 0, done.stderr
            result = json.loads(done.stdout)
            proof, ready = result["readiness"], result["final"]["ready_workers"]
        else:
            with cluster_phase(f"{kind}/{kind}-fw", 3, timeout=60, reassert_interval=None, deck=False) as phase:
                proof, ready = phase.framework_check, head.alive_count()
                joined = time.monotonic() >= head.last_join()
                # The restore to 0 waits until the head dropped them (docs/readiness.md, "Scale-down").
                gone_at = head.leave_after(3, 0.5)
            assert joined and head.alive_count() == 0 and time.monotonic() >= gone_at
        if surface != "phase":
            assert head.alive_count() == 3 and time.monotonic() >= head.last_join()
        assert ready == 3 and f"3 workers registered with" in proof and head.url in proof


def test_wait_node_and_status_wait_see_the_framework(scaler, tmp_path, monkeypatch):
    with SparkMasterServer() as head:
        set_env(monkeypatch, head_env("spark", head, tmp_path))
        request = ScaleCluster("request_spark", cluster="spark/spark-fw", replicas=2, wait=False, timeout=60)()
        assert request.readiness == "" and not request.waited
        head.join_after(POD_DELAY + 1.0, POD_DELAY + 1.5)
        ready = WaitForCluster("ready_spark", cluster="spark/spark-fw", timeout=60)()
        assert head.alive_count() == 2 and time.monotonic() >= head.last_join()
        assert ready.ready_workers == 2 and "2 workers registered with the Spark master" in ready.readiness
        head.join_after(0.0)
        head.kill(2)
        head.join_after(1.0)
        done = cli("status", "--kind", "spark", "--name", "spark-fw", "--wait", "--timeout", "30")
        assert done.returncode == 0, done.stderr
        assert head.alive_count() == 2 and "ready:  2 worker pods exist" in done.stdout


def test_override_url_wins_over_domino_variables(scaler, monkeypatch):
    with RayDashboardServer() as head:
        set_env(monkeypatch, {"RAY_HEAD_SERVICE_HOST": "127.0.0.1", "DDLSCALE_RAY_DASHBOARD_PORT": str(free_port()),
                              "DDLSCALE_RAY_URL": head.url})
        head.join_after(POD_DELAY + 0.8)
        outcome = ScaleCluster("up_override", cluster="ray/ray-fw", replicas=1, timeout=30)()
        assert head.alive_count() == 1 and head.url in outcome.readiness
        head.join_after(0.8)
        argument = ScaleCluster("up_arg", cluster="ray/ray-fw", replicas=2, timeout=30, framework_url=head.url + "/")()
        assert head.alive_count() == 2 and argument.ready_workers == 2


@pytest.mark.parametrize("how", ["env", "node", "cli"])
def test_switched_off_returns_when_the_pods_exist(how, scaler, tmp_path, monkeypatch):
    with RayDashboardServer() as head:
        set_env(monkeypatch, head_env("ray", head, tmp_path))
        head.join_after(3600, 3600)
        if how == "env":
            monkeypatch.setenv("DDLSCALE_FRAMEWORK_READINESS", "off")
        if how == "cli":
            done = cli("scale", "--kind", "ray", "--name", "ray-fw", "--replicas", "2", "--no-framework-check",
                       "--json")
            assert done.returncode == 0, done.stderr
            proof, ready = json.loads(done.stdout)["readiness"], json.loads(done.stdout)["final"]["ready_workers"]
        else:
            node = ScaleCluster(f"off_{how}", cluster="ray/ray-fw", replicas=2, timeout=60,
                                framework_ready=how != "node")
            outcome = node()
            proof, ready = outcome.readiness, outcome.ready_workers
        assert head.alive_count() == 0
        assert proof.endswith("framework check off") and ready in (-1, None)
        assert not any(path.startswith("/api/v0/nodes") for path in head.requests)


def test_unreachable_head_times_out_naming_what_it_waited_for(scaler, monkeypatch):
    port = free_port()
    set_env(monkeypatch, {"RAY_HEAD_SERVICE_HOST": "127.0.0.1", "DDLSCALE_RAY_DASHBOARD_PORT": str(port)})
    with pytest.raises(ScalingTimeoutError) as raised:
        ScaleCluster("unreachable", cluster="ray/ray-fw", replicas=1, timeout=3)()
    message = str(raised.value)
    assert f"1 workers registered with the Ray head at http://127.0.0.1:{port}" in message
    assert "$RAY_HEAD_SERVICE_HOST" in message and "never answered" in message
    done = cli("scale", "--kind", "ray", "--name", "ray-fw", "--replicas", "2", "--timeout", "3", "--json")
    assert done.returncode == 3
    assert "workers registered with the Ray head" in json.loads(done.stdout)["message"]


def test_bad_framework_url_is_refused_before_any_change(scaler):
    from flytekitplugins_ddlscale.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="framework_url"):
        ScaleCluster("bad_url", cluster="ray/ray-fw", replicas=2, framework_url="ray-head:8265")
    done = cli("scale", "--kind", "ray", "--name", "ray-fw", "--replicas", "2", "--framework-url", "ray-head:8265")
    assert done.returncode == 2 and "framework_url" in done.stderr
    assert scaler.cluster_object("ray", "ray-fw")["spec"]["worker"]["replicas"] == 0


def test_a_framework_url_with_credentials_is_refused_masked_in_json(scaler):
    url = "http://admin:pw-s3cret-2468@127.0.0.1:8265"
    done = cli("scale", "--kind", "ray", "--name", "ray-fw", "--replicas", "2", "--framework-url", url, "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 2 and answer["error"] == "invalid_input"
    assert "framework_url='http://***@127.0.0.1:8265'" in answer["message"]
    assert "pw-s3cret-2468" not in done.stdout + done.stderr
    assert scaler.cluster_object("ray", "ray-fw")["spec"]["worker"]["replicas"] == 0


connector_node = ScaleCluster("conn_ray", cluster="ray/ray-fw", replicas=2, timeout=60,
                              container_image="registry/flows:v1")


def test_connector_checks_a_head_it_is_told_about(scaler, monkeypatch):
    from tests.test_connector import template_and_inputs

    with RayDashboardServer() as head:
        # The connector runs outside the Domino run: only an explicit address reaches the head.
        monkeypatch.setenv("DDLSCALE_RAY_URL", head.url)
        connector = ScalingConnector(SCALE_TASK_TYPE)
        template, inputs = template_and_inputs(connector_node, replicas=2)
        meta = connector.create(template, "", inputs)
        head.join_after(POD_DELAY + 1.0, POD_DELAY + 1.5)
        phases = []
        while True:
            resource = asyncio.run(connector.get(meta))
            phases.append(resource.phase)
            if resource.phase != TaskExecution.RUNNING:
                break
            assert "registered with the Ray head" in resource.message or "2 workers" in resource.message
            time.sleep(0.1)
        assert resource.phase == TaskExecution.SUCCEEDED, resource.message
        assert head.alive_count() == 2 and time.monotonic() >= head.last_join()
        outcome = resource.outputs["o0"]
        assert outcome.ready_workers == 2 and head.url in outcome.readiness
        assert TaskExecution.RUNNING in phases


def test_connector_without_a_head_address_says_so(scaler):
    from tests.test_connector import template_and_inputs

    connector = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(connector_node, replicas=1)
    meta = connector.create(template, "", inputs)
    deadline = time.monotonic() + 30
    while (resource := asyncio.run(connector.get(meta))).phase == TaskExecution.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
    assert resource.phase == TaskExecution.SUCCEEDED
    assert ("framework not checked (neither the backend nor the connector's environment says where the head is: "
            "give the node a framework_url, or set $DDLSCALE_RAY_URL for the connector)") in resource.outputs["o0"].readiness


def test_node_rides_out_a_head_restart(scaler, tmp_path, monkeypatch):
    with RayDashboardServer() as head:
        set_env(monkeypatch, head_env("ray", head, tmp_path))
        head.join_after(POD_DELAY + 0.3, POD_DELAY + 2.5)
        time.sleep(POD_DELAY)
        head.outage(1.5)
        outcome = ScaleCluster("up_outage", cluster="ray/ray-fw", replicas=2, timeout=60)()
        assert head.alive_count() == 2 and time.monotonic() >= head.last_join()
        assert outcome.ready_workers == 2


def test_a_wait_for_workers_that_can_never_come_fails_at_once(scaler):
    from flytekitplugins_ddlscale.errors import InvalidInputError

    ScaleCluster("to_two", cluster="spark/spark-fw", replicas=2, wait=False)()
    started = time.monotonic()
    with pytest.raises(InvalidInputError, match=r"replicas=3: .*spec.worker.replicas=2 desired, maxReplicas=4"):
        WaitForCluster("never", cluster="spark/spark-fw", timeout=600)(replicas=3)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("variable, value", [("DDLSCALE_FRAMEWORK_READINESS", "sometimes"),
                                             ("DDLSCALE_RAY_DASHBOARD_PORT", "dashboard")])
def test_bad_framework_settings_are_refused_before_any_change(variable, value, scaler, monkeypatch):
    from flytekitplugins_ddlscale.errors import InvalidInputError

    monkeypatch.setenv("RAY_HEAD_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidInputError, match=variable):
        ScaleCluster("bad_setting", cluster="ray/ray-fw", replicas=2, timeout=30)()
    with pytest.raises(InvalidInputError, match=variable):
        with cluster_phase("ray/ray-fw", 2, timeout=30, reassert_interval=None, deck=False):
            pass
    done = cli("scale", "--kind", "ray", "--name", "ray-fw", "--replicas", "2", "--timeout", "30")
    assert done.returncode == 2 and variable in done.stderr
    assert scaler.cluster_object("ray", "ray-fw")["spec"]["worker"]["replicas"] == 0
    assert scaler.count("PATCH") == 0
