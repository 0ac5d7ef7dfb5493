"""Two connector replicas: the one answering a node's polls may not be the one whose create sent the change.

A Deployment's rolling update runs the old and the new connector pod side by
side, and FlytePropeller's calls may reach either. Replica A is a stock
``pyflyte serve connector`` process (called over gRPC, as FlytePropeller
does); replica B is this test process's connector, whose shared caches are
warm and behind A's write: the Kubernetes test server holds back the watch
events, as a lagging watch cache does (a real API server cannot be made to
lag on purpose). The metadata A's create returns carries the version its
write left, and B's polls trust their cache only from that version on.
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
from tests.servers.k8s_server import K8sTestServer
from tests.test_connector import k8s_restore, poll
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


def test_a_cluster_version_that_is_not_one_is_refused_naming_the_field():
    meta = ScalingMetadata("ddlscale_scale", "ray/c1", "", 2, 1.0, 2.0, "{}", cluster_version="12 34")
    refused = ScalingMetadata.decode(meta.encode())
    assert refused.error.startswith("[invalid_input] invalid resource_meta.cluster_version='12 34'"), refused.error
    assert "printable ASCII" in refused.error
    kept = ScalingMetadata("ddlscale_scale", "ray/c1", "", 2, 1.0, 2.0, "{}", cluster_version="4711")
    assert ScalingMetadata.decode(kept.encode()) == kept
