"""Every scale-down waits until the framework dropped the removed workers, not only their pods.

The backends' waits end when the removed workers' pods are gone; the Ray
head (the dashboard test server here) still lists them ALIVE for a while, as
Ray's GCS does until a node's health checks fail. Each surface that scales
down (a ScaleCluster node to fewer, a RestoreCluster node, ``ddlscale
restore`` in a subprocess, a phase's restore, the connector) must return
only after the head dropped them, on the scaler backend (its test server)
and on the Kubernetes backend (its test server, a KubeRay cluster).
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

from flytekitplugins_ddlscale import ReplicaSpec
from flytekitplugins_ddlscale.connector import ScalingConnector
from flytekitplugins_ddlscale.errors import ScalingTimeoutError
from flytekitplugins_ddlscale.phase import cluster_phase
from flytekitplugins_ddlscale.tasks import SCALE_TASK_TYPE, RestoreCluster, ScaleCluster
from tests.contract_support import write_kubeconfig
from tests.framework_support import use_scaler
from tests.servers.k8s_server import K8sTestServer
from tests.servers.ray_dashboard import RayDashboardServer
from tests.servers.scaler_server import ScalerTestServer

DDLSCALE = str(Path(sys.executable).parent / "ddlscale")
LINGER = 2.0
"""Seconds the head still lists removed workers after the scale-down was sent."""


@pytest.fixture(params=["scaler", "kubernetes"])
def cluster(request, tmp_path, monkeypatch):
    """A Ray cluster with 3 workers the head lists, on the scaler or the Kubernetes test server,
    chosen through the environment; yields (cluster text, the head)."""
    for name in ("DDLSCALE_BACKEND", "KUBECONFIG", "CLUSTER_SCALER_BASE_URL", "DOMINO_RUN_ID", "DOMINO_API_PROXY",
                 "RAY_HEAD_SERVICE_HOST", "DDLSCALE_FRAMEWORK_URL", "DDLSCALE_FRAMEWORK_READINESS"):
        monkeypatch.delenv(name, raising=False)
    with RayDashboardServer() as head:
        monkeypatch.setenv("DDLSCALE_RAY_URL", head.url)
        if request.param == "scaler":
            with ScalerTestServer(pod_ready_delay=0.05) as server:
                server.add_cluster("ray", "ray-fw", replicas=1, max_replicas=4, min_replicas=None)
                use_scaler(monkeypatch, server, tmp_path / "state")
                monkeypatch.setenv("DDLSCALE_RAY_URL", head.url)
                yield _scaled_up("ray/ray-fw", head), head
        else:
            with K8sTestServer(ready_delay=0.02) as server:
                server.add_kuberay("r1", groups=[{"groupName": "cpu", "replicas": 1}])
                monkeypatch.setenv("DDLSCALE_BACKEND", "kubernetes")
                monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server.url)))
                monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "state"))
                yield _scaled_up("kuberay/r1@cpu", head), head


def _scaled_up(cluster: str, head: RayDashboardServer) -> str:
    head.join_after(0.0, 0.0, 0.0)
    ScaleCluster("up", cluster=cluster, replicas=3, timeout=60)()
    return cluster


def _dropped(head: RayDashboardServer, gone_at: float, workers: int = 1) -> None:
    assert head.alive_count() == workers and time.monotonic() >= gone_at


def test_a_scale_node_to_fewer_workers_returns_once_the_head_dropped_them(cluster):
    name, head = cluster
    gone_at = head.leave_after(2, LINGER)
    outcome = ScaleCluster("down", cluster=name, replicas=1, timeout=60)()
    _dropped(head, gone_at)
    assert "1 workers registered with the Ray head" in outcome.readiness


def test_a_restore_node_returns_once_the_head_dropped_the_removed_workers(cluster):
    name, head = cluster
    gone_at = head.leave_after(2, LINGER)
    outcome = RestoreCluster("restore", cluster=name, timeout=60)()
    _dropped(head, gone_at)
    assert outcome.workers == 1


def test_cli_restore_returns_once_the_head_dropped_the_removed_workers(cluster):
    name, head = cluster
    kind, rest = name.split("/", 1)
    group = ["--group", rest.split("@")[1]] if "@" in rest else []
    gone_at = head.leave_after(2, LINGER)
    done = subprocess.run([DDLSCALE, "restore", "--kind", kind, "--name", rest.split("@")[0], *group,
                           "--timeout", "60", "--json"], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    _dropped(head, gone_at)
    assert "1 workers registered with the Ray head" in json.loads(done.stdout)["readiness"]


def test_a_phase_restore_returns_once_the_head_dropped_the_removed_workers(cluster):
    name, head = cluster
    # The cluster already runs 3, so the phase would give back 3 as found: an explicit restore shrinks it.
    with cluster_phase(name, 3, restore=ReplicaSpec(1), timeout=60, reassert_interval=None, deck=False):
        gone_at = head.leave_after(2, LINGER)
    _dropped(head, gone_at)


def test_a_scale_down_times_out_naming_the_workers_the_head_still_lists(cluster):
    name, head = cluster
    with pytest.raises(ScalingTimeoutError, match=r"to drop the removed workers \(at most 1 registered\).*"
                       r"3 registered at its last answer; the removed workers are still registered"):
        RestoreCluster("restore", cluster=name, timeout=2)()


@pytest.mark.parametrize("cluster", ["scaler"], indirect=True)
def test_the_connector_succeeds_a_scale_down_once_the_head_dropped_the_workers(cluster):
    from tests.test_connector import template_and_inputs
    from tests.test_framework_surfaces import connector_node

    name, head = cluster
    connector = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(connector_node, replicas=1)
    gone_at = head.leave_after(2, LINGER)
    meta = connector.create(template, "", inputs)
    deadline = time.monotonic() + 60
    while (resource := asyncio.run(connector.get(meta))).phase == TaskExecution.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    _dropped(head, gone_at)
