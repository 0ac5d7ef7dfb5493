"""Backend faults, aborts and deadlines as the real FlytePropeller v1.16.8 handles them.

One plane (:class:`~tests.flyte_tier.plane.FlytePlane`, the connector serving the
scaler backend) runs every flow of :mod:`tests.flyte_apps.faults` against the
scaler test server; ``ddlscale_*`` nodes go to the connector, a
``@distributed_phase`` task runs in a pod (the process kubelet), so both
modes meet the same staged faults:

* retries: what FlytePropeller retries is counted from the task events it
  sends flyteadmin (``retry_attempt``), the end read from the FlyteWorkflow;
* abort: executions are terminated as flyteadmin's ``TerminateExecution``
  does (the FlyteWorkflow deleted: :meth:`FlytePlane.terminate`);
* deadlines: a node's own ``timeout`` and FlytePropeller's node deadline.

A fault that must end between two attempts ends in a hook on flyteadmin's
event API: FlytePropeller waits for the answer to the event that reports
the first attempt failed before it starts the second, so the hook's change
happens in between, with no race and no sleep. Workers of the held
clusters never come (the scaler test server's pod delay), so a node is
genuinely RUNNING when it is aborted or reaches its deadline.
"""
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Set

import pytest
from flyteidl.core.execution_pb2 import NodeExecution, TaskExecution

from flytekitplugins_ddlscale._core.validation import MAX_REPLICAS
from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend
from flytekitplugins_ddlscale.refs import ClusterRef
from tests.envtest.controlplane import ENV_DIR
from tests.flyte_tier.admin_events import EventRecorder
from tests.flyte_tier.peers import peers_or_skip
from tests.flyte_tier.plane import NAMESPACE, Execution, FlytePlane
from tests.flyte_apps import faults
from tests.port_support import free_ports
from tests.servers.scaler_server import DEFAULT_API_KEY, ScalerTestServer

pytestmark = [pytest.mark.flyte, pytest.mark.slow]

NEVER = 24 * 3600.0
"""A pod delay no test outlives: these clusters' workers never come."""
FAILED_PHASES = {TaskExecution.FAILED, getattr(TaskExecution, "RETRYABLE_FAILED", TaskExecution.FAILED)}


class StagedRecorder(EventRecorder):
    """flyteadmin's event API (recorded as :class:`EventRecorder` does), with ``hooks`` called with each task
    event before it is answered: FlytePropeller waits for the answer before its next step."""

    def __init__(self) -> None:
        super().__init__()
        self.hooks: List[Callable[[Any], None]] = []

    def CreateTaskEvent(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        for hook in list(self.hooks):
            hook(request.event)
        return super().CreateTaskEvent(request, context)


class Scaler:
    """The scaler test server behind the plane, on a port fixed before the plane starts; down until
    :meth:`up` (connections refused: a service the connector has never reached)."""

    def __init__(self) -> None:
        self.server = ScalerTestServer()
        self.port, = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.serving = False

    def up(self) -> None:
        if not self.serving:
            self.server.start(self.port)
            self.serving = True

    def replicas(self, cluster: str) -> int:
        kind, name = cluster.split("/")
        return self.server.cluster_object(kind, name)["spec"]["worker"]["replicas"]

    def answered(self, status: int, path: str) -> int:
        return sum(1 for r in self.server.requests if r.status == status and path in r.path)


@pytest.fixture(scope="module")
def scaler() -> Iterator[Scaler]:
    staged = Scaler()
    server = staged.server
    for cluster in (faults.RESTARTED, faults.OUTAGE, faults.PHASED, faults.ABORTED_PHASE, faults.BAD):
        kind, name = cluster.split("/")
        server.add_cluster(kind, name, replicas=1, max_replicas=4)
    for cluster in (faults.HELD, faults.SLOW, faults.DEADLINE):
        kind, name = cluster.split("/")
        server.add_cluster(kind, name, replicas=1, max_replicas=4, pod_ready_delay=NEVER)
    try:
        yield staged
    finally:
        server.stop()


@pytest.fixture(scope="module")
def plane(scaler: Scaler) -> Iterator[FlytePlane]:
    peers = peers_or_skip()
    backend = {"CLUSTER_SCALER_BASE_URL": scaler.url, "DOMINO_API_KEY": DEFAULT_API_KEY,
               "DDLSCALE_FRAMEWORK_READINESS": "off"}
    built = FlytePlane(peers, Path(os.environ[ENV_DIR]), connector=True, pod_env=backend,
                       connector_env=dict(backend, DDLSCALE_CONNECTOR_BACKENDS="scaler"))
    built.events = StagedRecorder()
    with built:
        yield built


def _attempts(plane: FlytePlane, execution: str, node: str = "n0") -> Set[int]:
    return {e.retry_attempt for e in plane.events.tasks_of(execution, node)}


def _failed_first_attempt(event: Any, task: str) -> bool:
    return event.task_id.name.endswith(f".{task}") and event.retry_attempt == 0 and event.phase in FAILED_PHASES


def _error(execution: Execution, node: str = "n0") -> str:
    status = execution.nodes.get(node) or {}
    return (status.get("error") or {}).get("message", "") or status.get("message", "")


@pytest.fixture(scope="module")
def first_contact(plane: FlytePlane, scaler: Scaler) -> Execution:
    """The plane's first call of the scaler service: a head restart (``retries=1``) while the service is
    down, the connector never having reached it (connections refused); the service comes up when
    FlytePropeller reports the first attempt failed. Every other test runs after this one."""
    def up_after_first_attempt(event: Any) -> None:
        if _failed_first_attempt(event, "restart_retried"):
            scaler.up()

    plane.events.hooks.append(up_after_first_attempt)
    try:
        return plane.run(faults.restart_flow, {}, timeout=120)
    finally:
        plane.events.hooks.remove(up_after_first_attempt)
        scaler.up()


def test_a_head_restart_refused_before_it_was_sent_is_retried_by_flyte(plane, scaler, first_contact):
    """Connector mode: a backend never reached fails the restart's CreateTask (nothing sent), which
    FlytePropeller counts as a retryable failure: the second attempt restarts the head, SUCCEEDED."""
    execution = first_contact
    assert execution.phase == "Success", (execution.message, _error(execution), plane.log("connector"))
    assert _attempts(plane, execution.name) == {0, 1}
    assert scaler.server.count("PATCH", "/restart_head/") == 1  # sent once, by the second attempt


def test_a_transient_failure_in_a_pod_is_retried_by_flyte(plane, scaler, first_contact):
    """Container mode: a ``@distributed_phase`` task (``retries=1``) whose backend answers 503 fails
    recoverable; FlytePropeller runs it again and the second attempt succeeds, the cluster given back."""
    path = f"/cluster/daskclusters/{faults.PHASED.split('/')[1]}"
    scaler.server.inject_faults("status", count=4, status=503, path=path, method="GET")
    execution = plane.run(faults.phase_flow, {}, timeout=150)
    assert execution.phase == "Success", (execution.message, _error(execution))
    assert _attempts(plane, execution.name) == {0, 1}
    assert scaler.answered(503, path) == 4
    assert scaler.replicas(faults.PHASED) == 1


def test_a_transient_failure_of_a_connector_scale_is_ridden_out_in_one_attempt(plane, scaler, first_contact):
    """Connector mode, a scale (safe to repeat): the connector reads and sends again through the 503s
    (docs/connector.md, section 6): one attempt, SUCCEEDED, no retry of Flyte's spent."""
    path = f"/cluster/rayclusters/{faults.OUTAGE.split('/')[1]}"
    scaler.server.inject_faults("status", count=6, status=503, path=path, method="GET")
    execution = plane.run(faults.outage_flow, {}, timeout=120)
    assert execution.phase == "Success", (execution.message, _error(execution))
    assert _attempts(plane, execution.name) == {0}
    assert scaler.answered(503, path) == 6
    assert scaler.replicas(faults.OUTAGE) == 2


def test_bad_input_fails_on_the_first_attempt_and_nothing_is_sent(plane, scaler, first_contact):
    """Connector mode, bad input (``retries=1``): FlytePropeller counts every failed CreateTask as retryable
    (v1.16.8, webapi ``launch``), so the connector answers CreateTask with a refused metadata and the first
    GetTask is FAILED, which FlytePropeller does not retry: one attempt, the node's error the connector's one
    line as the plugin words a failed job (docs/flyte.md, Retries); no request reaches the backend."""
    execution = plane.run(faults.bad_input_flow, {"replicas": -3}, timeout=120)
    assert execution.phase == "Failed"
    assert _attempts(plane, execution.name) == {0}
    error = _error(execution)
    assert error == ("failed to run the job: [invalid_input] invalid replicas=-3; allowed: an integer from 0 to "
                     f"{MAX_REPLICAS}"), error
    assert [r.path for r in scaler.server.requests if faults.BAD.split("/")[1] in r.path] == []


def _pod_gone(plane: FlytePlane, pod: str, timeout: float) -> None:
    """Wait until pod ``pod`` is removed (its process ended and the process kubelet deleted it)."""
    from kubernetes import client, watch
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(plane.admin)
    try:
        version = core.read_namespaced_pod(pod, NAMESPACE).metadata.resource_version
    except ApiException as error:
        if error.status == 404:
            return
        raise
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for event in watch.Watch().stream(core.list_namespaced_pod, NAMESPACE, field_selector=f"metadata.name={pod}",
                                          resource_version=version, timeout_seconds=max(1, int(end - time.monotonic()))):
            if event["type"] == "DELETED":
                return
    raise AssertionError(f"pod {pod} was not removed within {timeout:g} s")


def _until_file(path: Path, timeout: float, what: str) -> None:
    """Wait until ``path`` exists (written by a task's body): AssertionError naming ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.1)


def _claims(scaler: Scaler, plane: FlytePlane, cluster: str) -> Dict[str, Any]:
    backend = ScalerServiceBackend(scaler.url, api_key=DEFAULT_API_KEY, state_dir=plane.state_dir)
    with backend:
        return backend.claims(ClusterRef.parse(cluster))


def test_terminating_during_a_phase_body_restores_the_cluster(plane, scaler, first_contact):
    """The execution is terminated while a ``@distributed_phase`` body runs: FlytePropeller deletes the pod,
    its process gets SIGTERM, and the phase gives the cluster back and drops its claim before it exits."""
    name = f"e{os.urandom(4).hex()}"
    marker = plane.work / f"{name}.in-body"
    plane.submit(faults.aborted_phase_flow, {"marker": str(marker)}, name)
    _until_file(marker, 120, "the phase's body to start")
    assert scaler.replicas(faults.ABORTED_PHASE) == 2
    assert len(_claims(scaler, plane, faults.ABORTED_PHASE)) == 1
    execution = plane.terminate(name)
    assert execution.phase == "Aborted", execution
    pod = f"{name}-n0-0"
    _pod_gone(plane, pod, 60)
    log = plane.kubelet.logs(NAMESPACE, pod)
    assert scaler.replicas(faults.ABORTED_PHASE) == 1, log[-3000:]
    assert _claims(scaler, plane, faults.ABORTED_PHASE) == {}, log[-3000:]
    assert "(PhaseInterrupted), restored to 1 worker (as found)" in log, log[-3000:]


def test_terminating_a_running_connector_scale_stops_its_wait_only(plane, scaler, first_contact):
    """The execution is terminated while a ScaleCluster node waits in the connector for workers that do not
    come: FlytePropeller calls DeleteTask, which stops the wait only (docs/connector.md, section 6): the
    cluster keeps the size asked for, no claim is left, the execution is Aborted."""
    name = f"e{os.urandom(4).hex()}"
    plane.submit(faults.held_flow, {}, name)
    plane.events.wait_for(lambda: any(e.phase == TaskExecution.RUNNING for e in plane.events.tasks_of(name, "n0")),
                          "the held scale RUNNING in the connector", 60)
    execution = plane.terminate(name)
    assert execution.phase == "Aborted", execution
    assert scaler.replicas(faults.HELD) == 2
    assert _claims(scaler, plane, faults.HELD) == {}
    assert plane.events.tasks_of(name, "n0")[-1].phase == TaskExecution.ABORTED
    assert plane.connector_calls("delete", "ddlscale_scale") >= 1


def test_a_node_whose_own_timeout_is_shorter_than_its_wait_fails_as_a_timeout(plane, scaler, first_contact):
    """The node's own ``timeout`` (2 s) passes before its workers come: the connector's FAILED answer is the
    node's error, as docs/errors.md says a timeout fails (the change left in place, its remedy), once."""
    execution = plane.run(faults.slow_flow, {}, timeout=120)
    assert execution.phase == "Failed"
    assert _attempts(plane, execution.name) == {0}
    error = _error(execution)
    assert "[timeout] ray/faults-slow: timed out after" in error and "waiting for 2 workers" in error, error
    assert "spec.worker.replicas=2 left in place" in error and "To restore the baseline: `ddlscale restore" in error
    assert "\n" not in error and scaler.replicas(faults.SLOW) == 2


def test_a_flyte_node_deadline_shorter_than_the_wait_ends_the_node(plane, scaler, first_contact):
    """A Flyte node timeout (``with_overrides(timeout=5 s)``) shorter than the node's own (600 s): FlytePropeller's
    execution deadline ends the node (docs/errors.md, Flyte's own deadline): a retryable failure, here with no
    retry left, its message FlytePropeller's; the task is aborted (DeleteTask: the wait stops) and the scale
    stays in place, with no remedy said."""
    deletes = plane.connector_calls("delete", "ddlscale_scale")
    execution = plane.run(faults.deadline_flow, {}, timeout=120)
    assert execution.phase == "Failed"
    # The node's end as FlytePropeller reported it to flyteadmin (what the UI shows). Which deadline ends it depends
    # on when FlytePropeller's next round comes: within twice the timeout, the execution deadline (a retryable
    # failure, no retry left: FAILED with its error); later, the active deadline (2 x the timeout) first: TIMED_OUT.
    ends = [e for e in plane.events.node_events if e.id.execution_id.name == execution.name and e.id.node_id == "n0"]
    last = ends[-1]
    if last.phase == NodeExecution.TIMED_OUT:
        said = [text for text in (execution.nodes["n0"].get("message", ""), execution.message) if "timeout" in text]
        assert all("task active timeout [10s] expired" in text for text in said), said
    else:
        assert last.phase == NodeExecution.FAILED, [(e.id.node_id, e.phase) for e in ends]
        assert last.error.code == "RetriesExhausted|TimeoutExpired", last.error
        assert last.error.message == "[1/1] currentAttempt done. Last Error: USER::task execution timeout [5s] expired"
    assert plane.events.tasks_of(execution.name, "n0")[-1].phase == TaskExecution.ABORTED
    assert plane.connector_calls("delete", "ddlscale_scale") == deletes + 1
    assert scaler.replicas(faults.DEADLINE) == 2
