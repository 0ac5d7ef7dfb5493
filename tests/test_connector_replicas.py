"""Two connector replicas: the one answering a node's polls may not be the one whose create sent the change.

A Deployment's rolling update runs the old and the new connector pod side by
side, and FlytePropeller's calls may reach either. Replica A is a stock
``pyflyte serve connector`` process (called over gRPC, as FlytePropeller
does); replica B is this test process's connector, whose shared reads are
warm and from before A's write.

Kubernetes backend: the test server holds back the watch events, as a
lagging watch cache does (a real API server cannot be made to lag on
purpose); the metadata A's create returns carries the version its write
left, and B's polls trust their cache only from that version on. Scaler
backend: B's shared read of the cluster is still within its age (1 s) when
B polls; B's polls reuse no read begun before the node's create.
"""
import asyncio
import os

import pytest
from flyteidl.core.execution_pb2 import TaskExecution
from flyteidl.service.agent_pb2_grpc import AsyncAgentServiceStub

from flytekitplugins_ddlscale.backends.kubernetes._informer import running_informers
from flytekitplugins_ddlscale.connector import ScalingConnector, ScalingMetadata
from flytekitplugins_ddlscale.tasks import RESTORE_TASK_TYPE, SCALE_TASK_TYPE, RestoreOutcome, ScaleCluster
from tests.contract_support import write_kubeconfig
from tests.flyte_support import SCALER_ENV
from tests.framework_support import use_scaler
from tests.servers.k8s_server import K8sTestServer
from tests.servers.scaler_server import ScalerTestServer
from tests.test_connector import k8s_restore, poll, ray_restore, ray_scale
from tests.test_connector_service import create, serving

k8s_scale = ScaleCluster("k8s_scale", cluster="ray/c1", replicas=3, timeout=60, backend="kubernetes")


@pytest.fixture
def replica_a(tmp_path, monkeypatch):
    """The Kubernetes test server with ray/c1 (one worker), reached through $KUBECONFIG by this process
    (replica B) and by a connector service in its own process (replica A): yields (server, A's stub)."""
    monkeypatch.delenv("DDLSCALE_BACKEND", raising=False)
    monkeypatch.delenv("DDLSCALE_CONNECTOR_BACKENDS", raising=False)
    with K8sTestServer() as server:
        server.add_cluster("ray", "c1", replicas=1)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
        with serving(env) as channel:
            yield server, AsyncAgentServiceStub(channel)


def test_a_replica_whose_cache_lags_never_answers_from_before_the_other_replica_s_write(replica_a):
    server, stub = replica_a
    scale, restore = ScalingConnector(SCALE_TASK_TYPE), ScalingConnector(RESTORE_TASK_TYPE)
    up = ScalingMetadata.decode(create(stub, k8s_scale, replicas=3))
    assert up.error == "" and up.cluster_version.isdigit(), up
    # B answers the scale-up's polls: its caches of pods and cluster objects run and hold c1 at 3 workers.
    done = poll(scale, up)
    assert done.phase == TaskExecution.SUCCEEDED, done.message
    assert {informer.resource.plural for informer in running_informers(None)} == {"pods", "rayclusters"}

    server.hold_events("rayclusters")
    server.hold_events("pods")
    # The operator removes no pod yet (as a real one, it acts after the write): the restore has workers to wait for.
    server.set_operator_held("c1", True)
    down = ScalingMetadata.decode(create(stub, k8s_restore))
    assert down.error == "" and down.target == 1 and int(down.cluster_version) > int(up.cluster_version), down
    # B's cache still holds c1 wanting 3 workers with 3 Ready, which would end a wait for 1 at once.
    first = asyncio.run(restore.get(down))
    assert first.phase == TaskExecution.RUNNING, first.message
    assert "desired=1" in first.message and "ready=3" in first.message, first.message

    server.set_operator_held("c1", False)
    server.release_events("rayclusters")
    server.release_events("pods")
    done = poll(restore, down)
    assert done.phase == TaskExecution.SUCCEEDED, done.message
    outcome = done.outputs["o0"]
    assert isinstance(outcome, RestoreOutcome) and outcome.ready_workers == 1, outcome
    assert server.ready_workers("c1") == 1


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
