"""Two connector replicas on the scaler backend, and the version a create's metadata carries.

A Deployment's rolling update runs the old and the new connector pod side by
side, and FlytePropeller's calls may reach either. Replica A is a stock
``pyflyte serve connector`` process (called over gRPC, as FlytePropeller
does); replica B is this test process's connector, whose shared read of the
cluster is still within its age (1 s) when B polls the node A created: B's
polls reuse no read begun before the node's create. (The Kubernetes
backend's replicas: tests/envtest/test_envtest_replicas.py.)
"""
import asyncio
import os

import pytest
from flyteidl.core.execution_pb2 import TaskExecution
from flyteidl.service.agent_pb2_grpc import AsyncAgentServiceStub

from flytekitplugins_ddlscale.connector import ScalingConnector, ScalingMetadata
from flytekitplugins_ddlscale.tasks import RESTORE_TASK_TYPE, SCALE_TASK_TYPE
from tests.flyte_support import SCALER_ENV
from tests.framework_support import use_scaler
from tests.servers.scaler_server import ScalerTestServer
from tests.test_connector import poll, ray_restore, ray_scale
from tests.test_connector_service import create, serving


@pytest.fixture
def scaler_replica_a(tmp_path, monkeypatch):
    """The scaler test server with ray/conn-ray (one worker), used by this process (replica B) and by a
    connector service in its own process (replica A), both recording baselines in one state folder (a
    volume both pods mount): yields (server, A's stub)."""
    with ScalerTestServer(pod_ready_delay=0.2) as server:
        server.add_cluster("ray", "conn-ray", replicas=1, max_replicas=4, min_replicas=None)
        use_scaler(monkeypatch, server, tmp_path / "state")
        monkeypatch.delenv("DDLSCALE_CONNECTOR_BACKENDS", raising=False)
        env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
        env.update(CLUSTER_SCALER_BASE_URL=server.url, DOMINO_API_KEY=os.environ["DOMINO_API_KEY"],
                   DDLSCALE_STATE_DIR=str(tmp_path / "state"))
        with serving(env) as channel:
            yield server, AsyncAgentServiceStub(channel)


def test_a_replica_never_answers_from_a_shared_read_begun_before_the_other_replica_s_change(scaler_replica_a):
    server, stub = scaler_replica_a
    scale, restore = ScalingConnector(SCALE_TASK_TYPE), ScalingConnector(RESTORE_TASK_TYPE)
    up = ScalingMetadata.decode(create(stub, ray_scale))
    done = poll(scale, up)  # B's last poll read conn-ray at 3 workers: a shared read, reused for 1 s
    assert done.phase == TaskExecution.SUCCEEDED, done.message
    server.set_pod_ready_delay(60.0)  # the removed workers stay for the rest of the test
    down = ScalingMetadata.decode(create(stub, ray_restore))
    assert down.error == "" and down.target == 1, down
    first = asyncio.run(restore.get(down))
    assert first.phase == TaskExecution.RUNNING, first.message
    assert "desired=1 existing=3" in first.message, first.message


def test_a_cluster_version_that_is_not_one_is_refused_naming_the_field():
    meta = ScalingMetadata("ddlscale_scale", "ray/c1", "", 2, 1.0, 2.0, "{}", cluster_version="12 34")
    refused = ScalingMetadata.decode(meta.encode())
    assert refused.error.startswith("[invalid_input] invalid resource_meta.cluster_version='12 34'"), refused.error
    assert "printable ASCII" in refused.error
    kept = ScalingMetadata("ddlscale_scale", "ray/c1", "", 2, 1.0, 2.0, "{}", cluster_version="4711")
    assert ScalingMetadata.decode(kept.encode()) == kept
