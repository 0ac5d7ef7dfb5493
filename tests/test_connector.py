"""The Flyte connector for every scaling node type: create sends once, each get observes and decides.

Driven two ways: directly with serialized templates and literal inputs (as
the connector service receives them), and through flytekit's own local
connector runner (AsyncConnectorExecutorMixin). Backends: the local backend,
the scaler test server and the Kubernetes test server, chosen through the
environment as in a deployment.
"""
import asyncio
import json
import logging
import time
from collections import OrderedDict

import pytest
from flytekit.exceptions.user import FlyteUserRuntimeException
from flyteidl.core.execution_pb2 import TaskExecution
from flytekit import FlyteContextManager
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.core.type_engine import TypeEngine
from flytekit.extend.backend.base_connector import AsyncConnectorExecutorMixin, ConnectorRegistry
from flytekit.tools.translator import get_serializable

from flytekitplugins_ddlscale.connector import (
    CREATE_TIMEOUT,
    POLL_BACKENDS,
    SERVED_TASK_TYPES,
    ScalingConnector,
    ScalingMetadata,
    head_env,
    register_connectors,
)
from flytekitplugins_ddlscale.errors import BackendUnavailableError
from flytekitplugins_ddlscale._framework.endpoints import resolve_endpoint
from flytekitplugins_ddlscale._services.nodes.names import TASK_TYPES
from flytekitplugins_ddlscale.refs import ClusterRef
from flytekitplugins_ddlscale.tasks import (
    RESTART_TASK_TYPE,
    RESTORE_TASK_TYPE,
    SCALE_TASK_TYPE,
    WAIT_TASK_TYPE,
    ClusterReady,
    RestartHead,
    RestartOutcome,
    RestoreCluster,
    RestoreOutcome,
    ScaleCluster,
    ScaleOutcome,
    WaitForCluster,
)
from tests.contract_support import write_kubeconfig
from tests.flyte_apps import nodes
from tests.flyte_support import local_backend, local_env  # noqa: F401 - fixture
from tests.framework_support import use_scaler
from tests.servers.k8s_server import K8sTestServer
from tests.servers.scaler_server import ScalerTestServer

SETTINGS = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))


@pytest.fixture
def local_served(local_env, monkeypatch):
    """``local_env``, with a connector that serves the local backend (it does only when listed):
    the registered connectors are rebuilt for the test, and rebuilt with the defaults after it."""
    monkeypatch.setenv("DDLSCALE_CONNECTOR_BACKENDS", "local")
    register_connectors()
    yield local_env
    monkeypatch.delenv("DDLSCALE_CONNECTOR_BACKENDS")
    register_connectors()


def template_and_inputs(task, **values):
    template = get_serializable(OrderedDict(), SETTINGS, task).template
    ctx = FlyteContextManager.current_context()
    literals = TypeEngine.dict_to_literal_map(ctx, values, {k: task.python_interface.inputs[k] for k in values})
    return template, literals


def refused(connector, template, inputs=None):
    """The one line a refused node fails with: ``create`` answers (FlytePropeller retries a failed create) with a
    refused metadata naming no cluster, and the first ``get`` of it, decoded as the service decodes it, is FAILED
    with that line."""
    meta = connector.create(template, "", inputs)
    assert meta.error and (meta.cluster, meta.backend, meta.pending, meta.target) == ("", "", "", -1), meta
    resource = asyncio.run(connector.get(ScalingMetadata.decode(meta.encode())))
    assert resource.phase == TaskExecution.FAILED and resource.message == meta.error
    assert "\n" not in resource.message and resource.outputs is None
    # A later connector's field is ignored, as this connector's newer fields are by the ones before it.
    later = json.dumps(dict(json.loads(meta.encode()), later_field={"x": 1})).encode()
    assert asyncio.run(connector.get(ScalingMetadata.decode(later))).message == meta.error
    return resource.message


def create_fails(connector, template, inputs=None):
    """The one-line error ``create`` fails with (a failure Flyte's retries may get past), checked to carry no
    traceback to flytekit's service."""
    with pytest.raises(FlyteUserRuntimeException) as caught:
        connector.create(template, "", inputs)
    error = caught.value.value
    assert caught.value.__cause__ is error and error.__traceback__ is None
    assert "\n" not in str(error)
    return error


def poll(connector, meta, limit=60.0):
    deadline = time.monotonic() + limit
    while True:
        resource = asyncio.run(connector.get(meta))
        if resource.phase != TaskExecution.RUNNING or time.monotonic() > deadline:
            return resource
        time.sleep(0.2)


class ConnectorScaleCluster(AsyncConnectorExecutorMixin, ScaleCluster):
    """ScaleCluster run locally through flytekit's connector runner instead of in-process."""


connector_scale = ConnectorScaleCluster(
    "connector_scale", cluster="dask/conn-test", replicas=1, timeout=60, container_image="registry/flows:v1"
)

# Nodes on a Ray cluster: the scaler service restarts Ray heads only.
RAY = "ray/conn-ray"
ray_scale = ScaleCluster("ray_scale", cluster=RAY, replicas=3, timeout=60)
ray_restore = RestoreCluster("ray_restore", cluster=RAY, timeout=60)
ray_restart = RestartHead("ray_restart", cluster=RAY, timeout=60)
k8s_restart = RestartHead("k8s_restart", cluster="ray/c1", timeout=60, backend="kubernetes")
k8s_restore = RestoreCluster("k8s_restore", cluster="ray/c1", timeout=60, backend="kubernetes")
k8s_wait = WaitForCluster("k8s_wait", cluster="kuberay/kr", replicas=2, timeout=60, backend="kubernetes")


@pytest.fixture
def ray_scaler(tmp_path, monkeypatch):
    """The scaler test server with ray/conn-ray (1 worker, at most 4), chosen through the environment;
    the head comes back 1 s after a restart and is Ready 1 s later."""
    with ScalerTestServer(pod_ready_delay=0.5) as server:
        server.add_cluster("ray", "conn-ray", replicas=1, max_replicas=4, min_replicas=None)
        server.head_recreate_delay = server.head_ready_delay = 1.0
        use_scaler(monkeypatch, server, tmp_path / "state")
        monkeypatch.delenv("DDLSCALE_CONNECTOR_BACKENDS", raising=False)
        yield server


@pytest.fixture
def k8s(tmp_path, monkeypatch):
    """The Kubernetes test server with ray/c1 (a Domino Ray cluster), reached through $KUBECONFIG."""
    monkeypatch.delenv("DDLSCALE_BACKEND", raising=False)
    monkeypatch.delenv("DDLSCALE_CONNECTOR_BACKENDS", raising=False)
    with K8sTestServer() as server:
        server.add_cluster("ray", "c1", replicas=1)
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server.url)))
        yield server


def test_connectors_are_registered_for_every_node_type():
    # flytekit's start-up registers the names (connector_entry); each is answered by a ScalingConnector.
    assert SERVED_TASK_TYPES == TASK_TYPES
    assert set(SERVED_TASK_TYPES) == {SCALE_TASK_TYPE, WAIT_TASK_TYPE, RESTORE_TASK_TYPE, RESTART_TASK_TYPE}
    register_connectors()
    for task_type in SERVED_TASK_TYPES:
        assert isinstance(ConnectorRegistry.get_connector(task_type), ScalingConnector)


def test_metadata_round_trips_through_bytes():
    meta = ScalingMetadata("ddlscale_scale", "dask/x", "", 2, 1.0, 2.0, "{}")
    assert ScalingMetadata.decode(meta.encode()) == meta


@pytest.mark.slow
def test_scale_then_wait_through_the_connector(local_served):
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.request, replicas=2)
    meta = scale.create(template, "", inputs)
    assert meta.target == -1  # the node was defined with wait=False
    done = asyncio.run(scale.get(meta))
    assert done.phase == TaskExecution.SUCCEEDED and done.outputs["o0"].effective == 2

    wait = ScalingConnector(WAIT_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.ready, replicas=2)
    meta = wait.create(template, "", inputs)
    resource = poll(wait, ScalingMetadata.decode(meta.encode()))
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    ready = resource.outputs["o0"]
    assert isinstance(ready, ClusterReady) and ready.ready_workers == 2 and ready.backend == "local"


@pytest.mark.slow
def test_get_fails_at_the_deadline_with_the_last_state(scaler_server, tmp_path, monkeypatch):
    from tests.framework_support import use_scaler

    use_scaler(monkeypatch, scaler_server, tmp_path / "state")
    scaler_server.add_cluster("dask", "nodes-test", replicas=1, max_replicas=4)
    scaler_server.set_pod_ready_delay(3600.0)  # the requested pods never appear
    nodes.request()  # asks for 2 without waiting
    wait = ScalingConnector(WAIT_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.ready, replicas=2)
    meta = wait.create(template, "", inputs)
    assert asyncio.run(wait.get(meta)).phase == TaskExecution.RUNNING
    meta.deadline = meta.started  # as if the node's timeout had passed
    resource = asyncio.run(wait.get(meta))
    assert resource.phase == TaskExecution.FAILED
    assert "timed out" in resource.message and "desired=2" in resource.message


def test_a_wait_that_can_never_finish_is_refused_at_its_first_get(scaler_server, tmp_path, monkeypatch):
    use_scaler(monkeypatch, scaler_server, tmp_path / "state")
    scaler_server.add_cluster("dask", "nodes-test", replicas=1, max_replicas=4)
    wait = ScalingConnector(WAIT_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.ready, replicas=3)  # nothing will scale it to 3
    scaler_server.clear_requests()
    meta = wait.create(template, "", inputs)
    assert scaler_server.requests == []  # a wait sends nothing and reads nothing in create
    resource = asyncio.run(wait.get(ScalingMetadata.decode(meta.encode())))
    assert resource.phase == TaskExecution.FAILED and "[unreachable_wait]" in resource.message
    assert "replicas=3" in resource.message


def test_bad_inputs_are_refused_before_anything_starts(local_served):
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.scale_up, replicas=-1)
    message = str(refused(scale, template, inputs))
    assert message.startswith("[invalid_input] invalid replicas=-1; allowed: an integer from 0 to")
    assert local_backend(local_served).list_clusters() == []


@pytest.mark.slow
def test_flytekits_connector_runner_executes_the_node(local_served):
    outcome = connector_scale()
    assert isinstance(outcome, ScaleOutcome) and outcome.effective == 1 and outcome.ready_workers == 1


# ----- every node type: create sends once, get observes -----

def restart_patches(server):
    return server.count("PATCH", "/restart_head/")


def test_a_restart_is_sent_once_however_often_get_is_called(ray_scaler):
    connector = ScalingConnector(RESTART_TASK_TYPE)
    template, inputs = template_and_inputs(ray_restart)
    meta = connector.create(template, "", inputs)
    assert meta.error == "" and restart_patches(ray_scaler) == 1
    encoded = meta.encode()
    first = asyncio.run(connector.get(ScalingMetadata.decode(encoded)))
    assert first.phase == TaskExecution.RUNNING and "a new Ready head" in first.message
    resource = poll(connector, ScalingMetadata.decode(encoded))  # every poll from the stored bytes
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    outcome = resource.outputs["o0"]
    assert isinstance(outcome, RestartOutcome) and outcome.ready and outcome.waited
    assert outcome.pod == "conn-ray-ray-head-0" and outcome.backend == "scaler"
    for _ in range(3):
        assert asyncio.run(connector.get(ScalingMetadata.decode(encoded))).phase == TaskExecution.SUCCEEDED
    assert restart_patches(ray_scaler) == 1
    assert ray_scaler.count("GET", "/restart_head_status/") >= 2


def test_a_restart_on_kubernetes_waits_for_a_new_head_pod(k8s):
    old = k8s.pods("c1", component="head")[0]
    k8s.set_ready_delay(1.0)
    connector = ScalingConnector(RESTART_TASK_TYPE)
    template, inputs = template_and_inputs(k8s_restart)
    meta = connector.create(template, "", inputs)
    assert meta.error == "", meta.error
    assert asyncio.run(connector.get(ScalingMetadata.decode(meta.encode()))).phase == TaskExecution.RUNNING
    resource = poll(connector, ScalingMetadata.decode(meta.encode()))
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    new = k8s.pods("c1", component="head")[0]
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert [r.body["preconditions"]["uid"] for r in k8s.requests if r.method == "DELETE"] == [old["metadata"]["uid"]]


def test_a_restart_that_times_out_says_it_is_not_sent_again(ray_scaler):
    ray_scaler.head_recreate_delay = 3600.0  # the new head never comes
    connector = ScalingConnector(RESTART_TASK_TYPE)
    template, inputs = template_and_inputs(ray_restart)
    meta = connector.create(template, "", inputs)
    meta.deadline = meta.started  # as if the node's timeout had passed
    resource = asyncio.run(connector.get(meta))
    assert resource.phase == TaskExecution.FAILED
    assert resource.message.startswith("[timeout]") and "never sent again" in resource.message
    assert restart_patches(ray_scaler) == 1


def test_a_scale_then_a_restore_through_the_connector_puts_the_baseline_back(ray_scaler):
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(ray_scale)
    scaled = poll(scale, scale.create(template, "", inputs))
    assert scaled.phase == TaskExecution.SUCCEEDED and scaled.outputs["o0"].workers == 3, scaled.message
    ray_scaler.clear_requests()
    restore = ScalingConnector(RESTORE_TASK_TYPE)
    template, inputs = template_and_inputs(ray_restore)
    meta = restore.create(template, "", inputs)
    assert meta.error == "" and ray_scaler.count("PATCH", "/scale/") == 1
    assert ray_scaler.cluster_object("ray", "conn-ray")["spec"]["worker"]["replicas"] == 1
    resource = poll(restore, ScalingMetadata.decode(meta.encode()))
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    outcome = resource.outputs["o0"]
    assert isinstance(outcome, RestoreOutcome) and outcome.restored == "baseline"
    assert (outcome.previous_workers, outcome.workers, outcome.waited) == (3, 1, True)
    assert ray_scaler.count("PATCH", "/scale/") == 1  # get sent nothing
    # The baseline is forgotten: the scaler backend refuses a second restore, as it does in a node.
    assert "no baseline is recorded for ray/conn-ray" in str(refused(restore, template, inputs))
    assert ray_scaler.count("PATCH", "/scale/") == 1


def test_a_scale_failing_at_its_deadline_says_what_it_left_in_place(ray_scaler):
    ray_scaler.set_pod_ready_delay(3600.0)  # the new workers never appear
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(ray_scale)
    meta = scale.create(template, "", inputs)
    meta.deadline = meta.started
    message = asyncio.run(scale.get(meta)).message
    assert message.startswith("[timeout]") and "waiting for 3 workers" in message
    assert "spec.worker.replicas=3 left in place: 1 of 3 worker pods exist" in message
    assert "nothing was rolled back. To restore the baseline: `" in message
    assert "ddlscale restore --backend scaler --kind ray --name conn-ray" in message
    assert '.restore_baseline(ClusterRef("ray", "conn-ray"))' in message and "\n" not in message


def test_a_restore_failing_at_its_deadline_says_how_to_keep_waiting(ray_scaler):
    ray_scaler.set_pod_ready_delay(0.0)
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(ray_scale)
    assert poll(scale, scale.create(template, "", inputs)).phase == TaskExecution.SUCCEEDED
    ray_scaler.set_pod_ready_delay(3600.0)  # the workers leave slowly
    restore = ScalingConnector(RESTORE_TASK_TYPE)
    template, inputs = template_and_inputs(ray_restore)
    meta = restore.create(template, "", inputs)
    meta.deadline = meta.started
    message = asyncio.run(restore.get(meta)).message
    assert "spec.worker.replicas=1 (the restore) left in place" in message
    assert "the baseline record was cleared with the restore. To keep waiting for it" in message
    assert "ddlscale status --backend scaler --kind ray --name conn-ray --wait" in message


def test_a_scale_whose_backend_hangs_at_its_deadline_says_what_it_left_in_place(ray_scaler):
    """The poll's own wait ends before the hung read does: the node fails saying the backend did not
    answer, what the poll last knew, and, as every failed wait after a scale does, what the scale left
    in place and how to undo it (the same remedy the read would have given had it ended first)."""
    ray_scaler.set_pod_ready_delay(3600.0)
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(ray_scale)
    meta = scale.create(template, "", inputs)
    meta.deadline = meta.started
    with POLL_BACKENDS.backend("scaler"):  # open, as after the node's earlier polls
        ray_scaler.hang()
        try:
            answer = asyncio.run(scale.desk.answer_async(meta, budget=0.5))
        finally:
            ray_scaler.resume()
    message = answer.message
    assert answer.state == "FAILED" and message.startswith("[timeout]"), message
    assert "the backend did not answer within 0.5 s" in message and "last known: nothing read yet" in message
    assert "spec.worker.replicas=3 left in place" in message and "nothing was rolled back" in message
    assert "ddlscale restore --backend scaler --kind ray --name conn-ray" in message and "\n" not in message


def test_create_gives_a_slow_backend_a_short_bound_and_leaves_the_scale_to_the_polls(ray_scaler, caplog):
    """A scaler service that holds the scale request (here 6 bounds long) makes create answer after its
    bound, the scale not sent, instead of failing the node (FlytePropeller would spend a retry on it);
    the polls send it once the service answers, and the node ends with the outcome of that send. The
    audit trail has the create (deferred) and the poll's send (sent, with the sizes)."""
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale.connector.audit")
    ray_scaler.inject_faults("delay", count=1, delay=6 * CREATE_TIMEOUT, path="/scale/")
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(ray_scale)
    meta = scale.create(template, "", inputs)
    assert meta.pending and meta.target == -1 and meta.cluster == RAY and len(meta.encode()) < 4096
    assert ray_scaler.cluster_object("ray", "conn-ray")["spec"]["worker"]["replicas"] == 1
    resource = poll(scale, ScalingMetadata.decode(meta.encode()))
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    outcome = resource.outputs["o0"]
    assert (outcome.previous_workers, outcome.workers) == (1, 3) and outcome.waited
    audit = [json.loads(r.getMessage().split(" ", 1)[1]) for r in caplog.records
             if r.name == "flytekitplugins_ddlscale.connector.audit"]
    assert [(a["result"], a["before"], a["after"]) for a in audit] == [("deferred", None, None), ("sent", 1, 3)]


def test_create_gives_a_stalled_read_before_a_restore_the_same_bound(k8s):
    """An API server that answers nothing while the restore reads the baseline: create answers after its
    bound (nothing was sent: the restore is left to the polls) instead of waiting on the client's own
    timeouts; the first poll after the server answers again sends it."""
    restore = ScalingConnector(RESTORE_TASK_TYPE)
    template, inputs = template_and_inputs(k8s_restore)
    with k8s.lock:  # every request waits for it: the server hangs
        meta = restore.create(template, "", inputs)
        assert meta.pending and k8s.count("PATCH") == 0
        stalled = asyncio.run(restore.get(meta))
    assert stalled.phase == TaskExecution.RUNNING and "sending the restore again" in stalled.message
    resource = poll(restore, meta)
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    assert resource.outputs["o0"].restored == "nothing recorded"


def test_a_deferred_change_is_checked_when_the_backend_is_back(ray_scaler):
    """A cluster the backend does not know, found once the scale is sent by a poll: FAILED with the one line
    create would have failed with; a malformed deferred change is FAILED naming its field."""
    ray_scaler.inject_faults("delay", count=1, delay=6 * CREATE_TIMEOUT, path="/cluster/", method="GET")
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(ray_scale)
    template.custom["cluster"] = "ray/missing"
    meta = scale.create(template, "", inputs)
    assert meta.pending
    resource = poll(scale, meta)
    ray_scaler.clear_faults()
    expected = str(refused(scale, template, inputs))
    assert resource.phase == TaskExecution.FAILED and resource.message == expected
    assert expected.startswith("[not_found]")
    for pending, field in (('{"custom": [], "inputs": {}}', "resource_meta.pending.custom"),
                           ('{"custom": {}, "inputs": {"replicas": 3, "x": 1}}', "resource_meta.pending.inputs.x"),
                           ("[", "resource_meta.pending")):
        bad = ScalingMetadata.decode(meta.encode())
        bad.pending = pending
        message = asyncio.run(scale.get(bad)).message
        assert f"invalid {field}=" in message and "\n" not in message, message


def test_a_restart_the_backend_stalls_on_fails_instead_of_being_sent_again(ray_scaler):
    ray_scaler.inject_faults("delay", count=10, delay=6 * CREATE_TIMEOUT, path="/restart_head/")
    connector = ScalingConnector(RESTART_TASK_TYPE)
    template, inputs = template_and_inputs(ray_restart)
    meta = connector.create(template, "", inputs)
    resource = asyncio.run(connector.get(ScalingMetadata.decode(meta.encode())))
    assert resource.phase == TaskExecution.FAILED and "\n" not in resource.message
    assert "the head restart may have been sent and is not sent again" in resource.message
    assert resource.message.startswith("[unconfirmed_change] ")  # UnconfirmedChangeError, not a bare ScalingError
    assert restart_patches(ray_scaler) == 1


def test_a_restart_meeting_the_backend_down_before_it_is_sent_still_fails_create(ray_scaler):
    """A head restart is never left to the polls (they must not send one): a service that is down when
    create comes fails the create (nothing sent, so FlytePropeller's retry may send it), as before."""
    connector = ScalingConnector(RESTART_TASK_TYPE)
    template, inputs = template_and_inputs(ray_restart)
    ray_scaler.stop()
    error = create_fails(connector, template, inputs)
    assert error.code == "backend_unavailable", str(error)
    assert restart_patches(ray_scaler) == 0


def test_a_restart_whose_state_read_stalls_still_answers_within_the_bound(ray_scaler):
    """The reads around a restart sent without waiting share its deadline: a service that holds every
    cluster read ends create with a one-line FAILED answer (the restart went out once), not a hang."""
    ray_scaler.inject_faults("delay", count=50, delay=6 * CREATE_TIMEOUT, path="/cluster/", method="GET")
    connector = ScalingConnector(RESTART_TASK_TYPE)
    template, inputs = template_and_inputs(ray_restart)
    resource = asyncio.run(connector.get(connector.create(template, "", inputs)))
    assert resource.phase == TaskExecution.FAILED and "may have been sent and is not sent again" in resource.message
    assert restart_patches(ray_scaler) == 1


def test_a_backend_that_cannot_see_restarts_is_refused_before_sending(ray_scaler, tmp_path, monkeypatch):
    """The local backend is served only when listed; listed, it restarts and observes its own heads,
    so a cluster that does not exist is refused with the backend's own error, nothing started."""
    monkeypatch.setenv("DDLSCALE_CONNECTOR_BACKENDS", "local")
    node_template, inputs = template_and_inputs(ray_restart)
    node_template.custom["backend"] = "local"
    assert str(refused(ScalingConnector(RESTART_TASK_TYPE), node_template, inputs)).startswith("[not_found]")
    assert restart_patches(ray_scaler) == 0


def test_the_wait_finds_the_head_the_backend_reports(k8s, monkeypatch):
    """A KubeRay cluster's head service, as the Kubernetes backend reports it, is where the connector
    looks for registered workers (as a node would from the variables Domino injects)."""
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

    k8s.add_kuberay("kr", groups=[{"groupName": "workers", "replicas": 2}])
    with KubernetesBackend() as backend:
        env = head_env(backend, ClusterRef("kuberay", "kr"), environ={"DDLSCALE_RAY_DASHBOARD_PORT": "8266", "HOME": "/x"})
    assert env["RAY_HEAD_SERVICE_HOST"] == "kr-head-svc.domino-compute.svc" and "HOME" not in env
    assert resolve_endpoint("kuberay", None, env).url == "http://kr-head-svc.domino-compute.svc:8266"
    wait = ScalingConnector(WAIT_TASK_TYPE)
    template, inputs = template_and_inputs(k8s_wait)
    resource = asyncio.run(wait.get(wait.create(template, "", inputs)))
    # The test cluster's head service has no DNS name here: the workers are up, the framework is not proven.
    assert resource.phase == TaskExecution.RUNNING
    assert "2 workers registered with the Ray head at http://kr-head-svc.domino-compute.svc:8265" in resource.message


# ----- malformed input: one line naming the field -----

def test_an_input_literal_of_the_wrong_type_is_refused_naming_the_input(ray_scaler):
    ctx = FlyteContextManager.current_context()
    template, _ = template_and_inputs(ray_scale)
    scale = ScalingConnector(SCALE_TASK_TYPE)
    for values, types, expected in (
        ({"replicas": "two"}, {"replicas": str}, "invalid inputs.replicas='two': not convertible"),
        ({"nodes": 2}, {"nodes": int}, "invalid inputs.nodes='<literal>'; allowed: one of the node's inputs: cluster,"),
    ):
        inputs = TypeEngine.dict_to_literal_map(ctx, values, types)
        assert expected in str(refused(scale, template, inputs))
    assert ray_scaler.count("PATCH") == 0


def test_an_outcome_that_create_did_not_write_is_refused_naming_the_field(ray_scaler):
    now = time.time()
    for outcome, field in (('{"cluster": "x", "surprise": 1}', "resource_meta.outcome.surprise=1"),
                           ('{"workers": "many"}', "resource_meta.outcome.workers='str'")):
        meta = ScalingMetadata(SCALE_TASK_TYPE, RAY, "", 1, now, now + 60, outcome)
        resource = asyncio.run(ScalingConnector(SCALE_TASK_TYPE).get(ScalingMetadata.decode(meta.encode())))
        assert resource.phase == TaskExecution.FAILED and f"invalid {field}" in resource.message
    restart = ScalingMetadata(RESTART_TASK_TYPE, RAY, "", 1, now, now + 60, "{}", awaits="head", restart="[]")
    resource = asyncio.run(ScalingConnector(RESTART_TASK_TYPE).get(ScalingMetadata.decode(restart.encode())))
    assert resource.phase == TaskExecution.FAILED and "invalid resource_meta.restart='list'" in resource.message
    assert ray_scaler.requests == []


@pytest.mark.slow
def test_a_restart_on_the_local_backend_ends_when_its_workers_are_back(local_served):
    scale = ScalingConnector(SCALE_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.scale_up, replicas=1)
    assert poll(scale, scale.create(template, "", inputs)).phase == TaskExecution.SUCCEEDED
    ref = ClusterRef.parse(nodes.CLUSTER)
    before = local_backend(local_served).connection_env(ref)
    restart = ScalingConnector(RESTART_TASK_TYPE)
    template, inputs = template_and_inputs(nodes.restart)
    meta = restart.create(template, "", inputs)
    assert meta.error == "", meta.error
    resource = poll(restart, ScalingMetadata.decode(meta.encode()))
    assert resource.phase == TaskExecution.SUCCEEDED, resource.message
    assert resource.outputs["o0"].ready and resource.outputs["o0"].backend == "local"
    state = local_backend(local_served).get_state(ref)
    assert state.head_ready and state.ready_workers == 1
    assert local_backend(local_served).connection_env(ref) == before  # the same port, a new scheduler
