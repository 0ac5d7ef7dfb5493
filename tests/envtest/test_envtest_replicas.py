"""Two connector replicas on one API server (the test server, then the real kube-apiserver).

A rolling update runs the old and the new connector pod side by side, so the
replica answering a node's ``GetTask`` may not be the one whose
``CreateTask`` sent the change. Replica A is a stock ``pyflyte serve
connector`` process (called over gRPC, as FlytePropeller does); replica B is
this test process's connector, whose shared caches are warm from the node
before. The metadata A's create returns carries the version its write left
(``cluster_version``); B trusts its cache of the cluster object only from
there. On the test server B's cache is made to lag behind A's write (watch
events held back, the operator held: a real API server cannot be made to lag
on purpose), where an answer from the cache would end a scale-down at once;
on the real API server the same steps check that the version a write
returns is one B's watch brings, so B's cache answers again afterwards.
"""
import asyncio
import os
from collections import OrderedDict
from pathlib import Path

import pytest
from flyteidl.admin import agent_pb2
from flyteidl.core.execution_pb2 import TaskExecution
from flyteidl.service.agent_pb2_grpc import AsyncAgentServiceStub
from flytekit.tools.translator import get_serializable

from flytekitplugins_ddlscale.backends.kubernetes._informer import at_least, running_informers
from flytekitplugins_ddlscale.connector import ScalingConnector, ScalingMetadata
from flytekitplugins_ddlscale.tasks import RESTORE_TASK_TYPE, SCALE_TASK_TYPE, RestoreCluster, RestoreOutcome, ScaleCluster
from tests.contract_support import write_kubeconfig
from tests.envtest.sides import TestServerSide
from tests.flyte_support import SCALER_ENV
from tests.test_connector import poll
from tests.test_connector_service import SETTINGS, serving

scale_up = ScaleCluster("replica_scale", cluster="ray/c1", replicas=3, timeout=120, backend="kubernetes")
restore = RestoreCluster("replica_restore", cluster="ray/c1", timeout=120, backend="kubernetes")


@pytest.fixture
def replica_a(side, tmp_path, monkeypatch):
    """A's stub; A and B reach ``side``'s API server with one kubeconfig, framework checks off."""
    if isinstance(side, TestServerSide):
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", side.server.url)
    else:
        kubeconfig = Path(side.envtest.plane.admin_kubeconfig)
    for name in ("DDLSCALE_BACKEND", "DDLSCALE_CONNECTOR_BACKENDS"):
        monkeypatch.delenv(name, raising=False)
    settings = {"KUBECONFIG": str(kubeconfig), "DDLSCALE_FRAMEWORK_READINESS": "off",
                "DDLSCALE_TIERS_FILE": str(side.tiers)}
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
    with serving({**env, **settings}) as channel:
        yield AsyncAgentServiceStub(channel)


def create_on(stub, task, cluster: str) -> ScalingMetadata:
    """CreateTask on replica A for ``task``'s template aimed at ``cluster``; the metadata it returned."""
    template = get_serializable(OrderedDict(), SETTINGS, task).template
    template.custom.update(cluster=cluster)
    request = agent_pb2.CreateTaskRequest(template=template.to_flyte_idl(), output_prefix="/tmp/out")
    return ScalingMetadata.decode(stub.CreateTask(request, timeout=30).resource_meta)


def test_a_replica_answers_a_node_another_replica_created_from_its_write_on(side, replica_a):
    side.add_cluster("ray", "c1", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 5})
    cluster = f"{side.namespace}/ray/c1"
    scaling, restoring = ScalingConnector(SCALE_TASK_TYPE), ScalingConnector(RESTORE_TASK_TYPE)
    up = create_on(replica_a, scale_up, cluster)
    assert up.error == "" and up.cluster_version, up
    assert at_least(side.get_object("ray", "c1")["metadata"]["resourceVersion"], up.cluster_version)
    # B answers the scale-up's polls: its caches of pods and cluster objects run and hold c1 at 3 workers.
    done = poll(scaling, up)
    assert done.phase == TaskExecution.SUCCEEDED, done.message
    (objects,) = [i for i in running_informers(None) if i.resource.plural == "rayclusters" and i.namespace == side.namespace]

    lagging = isinstance(side, TestServerSide)
    if lagging:
        side.server.hold_events("rayclusters")
        side.server.hold_events("pods")
        # The operator removes no pod yet (a real one acts after the write): the restore waits for them.
        side.server.set_operator_held("c1", True)
    down = create_on(replica_a, restore, cluster)
    assert down.error == "" and at_least(down.cluster_version, up.cluster_version), down
    first = asyncio.run(restoring.get(down))
    if lagging:
        # B's cache still holds c1 wanting 3 workers with 3 Ready, which would end a wait for 1 at once.
        assert first.phase == TaskExecution.RUNNING, first.message
        assert "desired=1" in first.message and "ready=3" in first.message, first.message
        side.server.set_operator_held("c1", False)
        side.server.release_events("rayclusters")
        side.server.release_events("pods")
    done = poll(restoring, down)
    assert done.phase == TaskExecution.SUCCEEDED, done.message
    outcome = done.outputs["o0"]
    assert isinstance(outcome, RestoreOutcome) and (outcome.previous_workers, outcome.ready_workers) == (3, 1)
    assert side.ready_workers("c1") == 1
    # The version A's write returned is one B's watch brings: from then on B's cache answers for c1 again.
    side.wait_for(lambda: objects.fresh("c1") is not None, "B's cache to reach the version A's write left")
    assert at_least(objects.fresh("c1")["metadata"]["resourceVersion"], down.cluster_version)
