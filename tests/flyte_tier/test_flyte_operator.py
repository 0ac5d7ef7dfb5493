"""The sandbox walkthrough's flow (``examples/k8s_operator_flow.py``) run by the real FlytePropeller on the REAL Dask operator.

One plane per mode, each set up as docs/sandbox.md tells a user, in its order:

1. the control plane (:class:`~tests.flyte_tier.plane.FlytePlane`: FlytePropeller with the sandbox's
   configuration and, in connector mode, step 6's block and a stock ``pyflyte serve connector`` with the
   env ``examples/k8s/connector.yaml`` gives it);
2. the Dask operator (its CRDs as the chart installs them, :mod:`tests.envtest.crds`; the operator under
   kopf, :mod:`tests.envtest.dask_operator`), ``kubectl create namespace dask-clusters`` and
   ``examples/k8s/dask-operator-cluster.yaml`` applied exactly as written;
3. ``examples/k8s/dask-operator-rbac.yaml`` in ``dask-clusters``, bound to the one non-admin user the
   connector and the task pods act as (:func:`tests.envtest.running.grant`), checked as the guide checks it
   (``kubectl auth can-i patch daskworkergroups``: yes);
5. the flow, handed to FlytePropeller (:meth:`FlytePlane.run`).

What a node and cluster DNS give the real cluster, given here: the fake kubelet makes the operator's pods
Ready, and :class:`~tests.envtest.dask_runtime.DaskRuntime` runs a real scheduler and one real worker per
worker pod. The stand-in for DNS and the Service's ClusterIP: the scheduler listens on a loopback address
of its own (127.x.y.z, the ClusterIP's stand-in) at the ports the manifest's Service declares (8786, 8787),
and one hosts file (:class:`~tests.envtest.dask_runtime.ClusterDns`) names
``shared-dask-scheduler.dask-clusters[.svc[.cluster.local]]`` there. The operator, the connector and every
task pod see that file as their ``/etc/hosts`` (a private mount namespace, nothing else of the machine
changed), so the flow's stage resolves the very name the backend's ``connection_env`` gives, as a pod's
resolver would through cluster DNS; nothing hands it the address. Where no private mount namespace can be
had (``unshare -rm``), the module is skipped saying so.

Asserted through what FlytePropeller did: the execution's phase on its FlyteWorkflow, the pods it created
(the API server's pods of the execution), the plugin its task events name, each node's outputs where its
last task event says they are (the scale's readiness proof, the stage's sum, the restore's sizes), and the
DaskWorkerGroup after it (its baseline size, no baseline or claims annotation, the operator having retired
the extra workers through the real scheduler). The two modes differ where docs/readiness.md says they do: the
connector finds the head in the backend's ``connection_env`` and waits until the workers registered with the
scheduler; the node in a pod has no such variable in its environment, and says the framework was not checked.
"""
import contextlib
import importlib
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest
import yaml

from flytekitplugins_ddlscale._core.records import BASELINE_ANNOTATION, CLAIMS_ANNOTATION
from tests.envtest.controlplane import ENV_DIR
from tests.flyte_tier.peers import peers_or_skip
from tests.flyte_tier.plane import NAMESPACE, Execution, FlytePlane

pytestmark = [pytest.mark.flyte, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "examples" / "k8s"
CLUSTER_FILE, RBAC_FILE, CONNECTOR_FILE = (K8S / "dask-operator-cluster.yaml", K8S / "dask-operator-rbac.yaml",
                                           K8S / "connector.yaml")
DASK = "kubernetes.dask.org"
CLUSTER = "dask-clusters/dask-operator/shared-dask"
READY_DELAY = 0.05
N = 20_000
"""The stage's input: small (the sum of squares of 2 chunks), the test is about the nodes around it."""
SCALED = 4
"""The workers the flow's ``ScaleCluster`` asks for (``replicas=4``)."""
SETUP_TIMEOUT = 90.0
RUN_TIMEOUT = 240.0


@dataclass
class OperatorPlane:
    """A running plane with the real Dask operator and the walkthrough's cluster at its baseline."""

    plane: FlytePlane
    operator: Any
    runtime: Any
    namespace: str
    name: str
    baseline: int
    timings: Dict[str, float] = field(default_factory=dict)


def _skip_reasons() -> List[str]:
    import importlib.util

    from tests.envtest.dask_runtime import ClusterDns

    reasons = []
    if importlib.util.find_spec("dask_kubernetes") is None or importlib.util.find_spec("kopf") is None:
        reasons.append("dask-kubernetes (with kopf) is not installed: install the test extra (README 'Install')")
    if not ClusterDns.available():
        reasons.append("no private mount namespace here (unshare -rm): nothing can resolve the scheduler Service")
    return reasons


def _connector_env() -> Dict[str, str]:
    """The connector container's env as examples/k8s/connector.yaml sets it."""
    for document in yaml.safe_load_all(CONNECTOR_FILE.read_text()):
        if document["kind"] == "Deployment":
            container = document["spec"]["template"]["spec"]["containers"][0]
            return {variable["name"]: variable["value"] for variable in container["env"]}
    raise AssertionError(f"{CONNECTOR_FILE} has no Deployment")


def _service_ip() -> str:
    """A loopback address for the scheduler Service's ClusterIP (127.0.0.1 left to the machine's own ports)."""
    return f"127.{random.randint(16, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def _until(ready: Callable[[], bool], what: str, timeout: float, log: Callable[[], str]) -> None:
    end = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; {log()}")
        time.sleep(0.2)


def _at_baseline(plane: FlytePlane, namespace: str, name: str, runtime: Any, workers: int) -> bool:
    """The operator's scheduler and ``workers`` workers Ready (read as the non-admin user: the grant works)
    and that many registered with the real scheduler."""
    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
    from flytekitplugins_ddlscale.errors import ClusterNotFoundError, InvalidInputError

    with KubernetesBackend(kubeconfig=str(plane.kube.user_kubeconfig), failure_grace=5) as backend:
        try:
            state = backend.get_state(ClusterRef("dask-operator", name, namespace))
        except (ClusterNotFoundError, InvalidInputError):
            return False  # the operator has not made the default worker group yet
    return state.head_ready is True and state.ready_workers == workers and len(runtime.registered()) == workers


def _can_i(plane: FlytePlane, verb: str, group: str, resource: str, namespace: str) -> bool:
    """``kubectl auth can-i VERB RESOURCE.GROUP -n NAMESPACE`` as the non-admin user."""
    from kubernetes import client

    with plane.kube.api_client(admin=False) as user:
        review = client.AuthorizationV1Api(user).create_self_subject_access_review({
            "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                            "namespace": namespace}}})
    return bool(review.status.allowed)


def _operator_plane(connector: bool, work: Path) -> Iterator[OperatorPlane]:
    peers = peers_or_skip(_skip_reasons())
    from kubernetes import client

    from tests.envtest.crds import install
    from tests.envtest.dask_operator import RealDaskOperator
    from tests.envtest.dask_runtime import ClusterDns, DaskRuntime
    from tests.envtest.kubelet import FakeKubelet
    from tests.envtest.running import grant

    cluster = yaml.safe_load(CLUSTER_FILE.read_text())
    namespace, name = cluster["metadata"]["namespace"], cluster["metadata"]["name"]
    baseline = cluster["spec"]["worker"]["replicas"]
    service = cluster["spec"]["scheduler"]["service"]
    ports = {port["name"]: port["port"] for port in service["ports"]}
    dns, ip = ClusterDns(work / "cluster.hosts"), _service_ip()
    timings: Dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        started = time.monotonic()
        plane = stack.enter_context(FlytePlane(
            peers, Path(os.environ[ENV_DIR]), connector=connector, connector_env=_connector_env(),
            work=work / "plane", hosts=dns.path))
        timings["plane"] = time.monotonic() - started
        # 2. The operator (the chart's CRDs and controller; its pods made Ready by the fake kubelet, which leaves
        # the task pods to the process kubelet), the namespace, the cluster as written.
        started = time.monotonic()
        install(plane.admin)
        kubelet = FakeKubelet(plane.admin, ready_delay=READY_DELAY, exclude_namespaces=[NAMESPACE]).start()
        stack.callback(kubelet.stop)
        operator = stack.enter_context(RealDaskOperator(plane.kube.admin_kubeconfig, work, dns=dns))
        client.CoreV1Api(plane.admin).create_namespace({"metadata": {"name": namespace}})
        runtime = stack.enter_context(DaskRuntime(plane.admin, namespace, name, work, host=ip,
                                                  ports=(ports["tcp-comm"], ports["http-dashboard"])))
        dns.serve(service_name(name), namespace, ip)
        client.CustomObjectsApi(plane.admin).create_namespaced_custom_object(
            DASK, "v1", namespace, "daskclusters", cluster)
        # 3. The Role, bound to the task pods' and the connector's identity.
        grant(plane.admin, RBAC_FILE, namespace)
        assert _can_i(plane, "patch", DASK, "daskworkergroups", namespace), "step 3: can-i patch daskworkergroups"
        _until(lambda: _at_baseline(plane, namespace, name, runtime, baseline),
               f"the operator's scheduler and {baseline} worker Ready and registered", SETUP_TIMEOUT,
               lambda: f"operator: {operator.tail()}\ndask: {runtime.tail()}\nkubelet: {kubelet.errors}")
        timings["operator and cluster"] = time.monotonic() - started
        yield OperatorPlane(plane, operator, runtime, namespace, name, baseline, timings)
        started = time.monotonic()
    print(f"\nflyte operator tier ({'connector' if connector else 'container'} mode): "
          + ", ".join(f"{what} {seconds:.1f} s" for what, seconds in timings.items())
          + f", stop {time.monotonic() - started:.1f} s")


def service_name(cluster: str) -> str:
    """The scheduler Service the Dask operator makes for ``cluster``."""
    return f"{cluster}-scheduler"


@pytest.fixture(scope="module")
def operator_plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorPlane]:
    """The plane of one mode (``request.param``: "connector" or "container"); pytest stops one mode's plane
    before it starts the other's, so the two never run at once."""
    yield from _operator_plane(request.param == "connector", tmp_path_factory.mktemp(f"operator-{request.param}"))


def _flow() -> Any:
    """``examples.k8s_operator_flow`` as registered with no ``$DDLSCALE_EXAMPLE_CLUSTER``: its default cluster,
    the walkthrough's (another module of the tier may have set the variable in this process)."""
    saved = os.environ.pop("DDLSCALE_EXAMPLE_CLUSTER", None)
    try:
        module = importlib.reload(sys.modules["examples.k8s_operator_flow"]) \
            if "examples.k8s_operator_flow" in sys.modules else importlib.import_module("examples.k8s_operator_flow")
    finally:
        if saved is not None:
            os.environ["DDLSCALE_EXAMPLE_CLUSTER"] = saved
    assert module.CLUSTER == CLUSTER
    return module


def _run(setup: OperatorPlane) -> Execution:
    started = time.monotonic()
    execution = setup.plane.run(_flow().operator_flow, {"n": N}, timeout=RUN_TIMEOUT)
    setup.timings["run"] = time.monotonic() - started
    assert execution.phase == "Success", (execution.message, execution.nodes, setup.plane.log("connector"),
                                          setup.plane.log("flytepropeller"))
    setup.timings.update(_node_seconds(setup, execution))
    return execution


def _node_seconds(setup: OperatorPlane, execution: Execution) -> Dict[str, float]:
    """Each node's time from its first event to its last, as FlytePropeller reported them (for the timings)."""
    spans: Dict[str, List[float]] = {}
    for event in setup.plane.events.node_events:
        if event.id.execution_id.name == execution.name:
            stamp = event.occurred_at.ToMicroseconds() / 1e6
            span = spans.setdefault(event.id.node_id, [stamp, stamp])
            span[0], span[1] = min(span[0], stamp), max(span[1], stamp)
    return {f"node {node}": end - start for node, (start, end) in sorted(spans.items())
            if node not in ("start-node", "end-node")}


def _tasks_by_node(setup: OperatorPlane, execution: Execution) -> Dict[str, Dict[str, str]]:
    """Each node's task name and the plugin FlytePropeller ran it with, from its task events."""
    found: Dict[str, Dict[str, str]] = {}
    for event in setup.plane.events.tasks_of(execution.name):
        node = found.setdefault(event.parent_node_execution_id.node_id, {})
        node["task"] = event.task_id.name.rsplit(".", 1)[-1]
        if event.metadata.plugin_identifier:
            node["plugin"] = event.metadata.plugin_identifier
    return found


def _pods(setup: OperatorPlane, execution: Execution) -> Dict[str, List[str]]:
    """The pods FlytePropeller created for the execution, by node (``<execution>-<node>-<attempt>``)."""
    from kubernetes import client

    by_node: Dict[str, List[str]] = {}
    for pod in client.CoreV1Api(setup.plane.admin).list_namespaced_pod(NAMESPACE).items:
        parts = pod.metadata.name.split("-")
        if pod.metadata.name.startswith(f"{execution.name}-") and len(parts) >= 3:
            by_node.setdefault(parts[-2], []).append(pod.metadata.name)
    return by_node


def _outputs(setup: OperatorPlane, execution: Execution, node: str) -> Dict[str, Any]:
    """The node's outputs as FlytePropeller recorded them (the ``outputs.pb`` its last task event names), by name,
    as flytekit literals."""
    import boto3
    from flyteidl.core import literals_pb2
    from flytekit.models.literals import LiteralMap

    from tests.flyte_tier.plane import S3_KEYS

    uris = [event.output_uri for event in setup.plane.events.tasks_of(execution.name, node) if event.output_uri]
    assert uris, f"no task event of {node} names its outputs"
    bucket, key = uris[-1][len("s3://"):].split("/", 1)
    s3 = boto3.client("s3", endpoint_url=setup.plane.s3_url, region_name="us-east-1",
                      aws_access_key_id=S3_KEYS["FLYTE_AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=S3_KEYS["FLYTE_AWS_SECRET_ACCESS_KEY"])
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return LiteralMap.from_flyte_idl(literals_pb2.LiteralMap.FromString(body)).literals


def _assert_nodes_did_their_work(setup: OperatorPlane, execution: Execution, nodes: Dict[str, str],
                                 connector: bool) -> None:
    """From the nodes' outputs: the scale set the flow's 4 workers and saw them Ready, the stage computed its sum
    on them, the restore put the baseline back. ``nodes``: task name -> node id.

    The scale's framework check, as docs/readiness.md says: the connector finds the head in the variables the
    backend reports (``connection_env``: the scheduler Service's name, which it resolves as a pod would), so it
    waits until the 4 workers registered with the real scheduler; a node in its pod finds it only in the run's
    environment (Domino's variables), which a Flyte pod lacks, so it says the framework was not checked
    (docs/sandbox.md, step 5: it "waits until 4 worker pods are Ready")."""
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.core.type_engine import TypeEngine

    from flytekitplugins_ddlscale import ScaleOutcome
    from flytekitplugins_ddlscale._services.nodes.restore import RestoreOutcome

    def output(task: str, kind: Any) -> Any:
        literal = _outputs(setup, execution, nodes[task])["o0"]
        return TypeEngine.to_python_value(FlyteContextManager.current_context(), literal, kind)

    up = output("operator_scale_up", ScaleOutcome)
    assert (up.previous_workers, up.workers, up.ready_workers) == (setup.baseline, SCALED, SCALED), up
    scheduler = f"http://{service_name(setup.name)}.{setup.namespace}.svc:8787"
    if connector:
        assert f"{SCALED} workers registered with the Dask scheduler at {scheduler}" in up.readiness, up.readiness
    else:
        assert up.readiness == (f"{SCALED} worker pods Ready (kubernetes); framework not checked (head address "
                                "unknown: set $DASK_SCHEDULER_SERVICE_HOST, $DDLSCALE_DASK_URL or "
                                "$DDLSCALE_FRAMEWORK_URL)"), up.readiness
    assert output("sum_of_squares", int) == sum(x * x for x in range(N))
    down = output("operator_restore", RestoreOutcome)
    assert (down.restored, down.previous_workers, down.workers) == ("baseline", SCALED, setup.baseline), down
    setup.timings["scale's wait"] = up.seconds_waited
    setup.timings["restore's wait"] = down.seconds_waited


def _assert_back_at_baseline(setup: OperatorPlane) -> None:
    """The DaskWorkerGroup at its recorded size, its baseline and claims annotations gone (docs/kubernetes.md),
    one worker pod, and the real scheduler retired the others (the operator's log)."""
    from kubernetes import client

    group = client.CustomObjectsApi(setup.plane.admin).get_namespaced_custom_object(
        DASK, "v1", setup.namespace, "daskworkergroups", f"{setup.name}-default")
    assert group["spec"]["worker"]["replicas"] == setup.baseline
    annotations = group["metadata"].get("annotations") or {}
    assert BASELINE_ANNOTATION not in annotations, annotations
    assert not annotations.get(CLAIMS_ANNOTATION, "").strip("{}[] "), annotations
    pods = client.CoreV1Api(setup.plane.admin).list_namespaced_pod(
        setup.namespace, label_selector=f"dask.org/workergroup-name={setup.name}-default")
    assert len(pods.items) == setup.baseline, [p.metadata.name for p in pods.items]
    assert "Retired workers" in setup.operator.tail(400000), setup.operator.tail()


@pytest.mark.parametrize("operator_plane", ["connector"], indirect=True)
def test_connector_mode_scales_the_operator_cluster_in_the_connector_and_runs_the_stage_in_a_pod(operator_plane):
    setup = operator_plane
    execution = _run(setup)
    tasks = _tasks_by_node(setup, execution)
    by_task = {node["task"]: (node_id, node.get("plugin")) for node_id, node in tasks.items()}
    assert set(by_task) == {"operator_scale_up", "sum_of_squares", "operator_restore"}, tasks
    pods = _pods(setup, execution)
    for task in ("operator_scale_up", "operator_restore"):
        node, plugin = by_task[task]
        assert plugin == "connector-service", (task, tasks)
        assert node not in pods, f"{task} ({node}) ran in a pod: {pods[node]}"
    node, plugin = by_task["sum_of_squares"]
    assert node in pods, f"the stage ({node}) ran in no pod: {pods}"
    assert plugin == "container", tasks
    _assert_nodes_did_their_work(setup, execution, {task: node for task, (node, _) in by_task.items()},
                                 connector=True)
    _assert_back_at_baseline(setup)


@pytest.mark.parametrize("operator_plane", ["container"], indirect=True)
def test_container_mode_runs_every_node_of_the_operator_flow_in_a_pod(operator_plane):
    setup = operator_plane
    execution = _run(setup)
    tasks = _tasks_by_node(setup, execution)
    assert {node["task"] for node in tasks.values()} == {"operator_scale_up", "sum_of_squares",
                                                         "operator_restore"}, tasks
    pods = _pods(setup, execution)
    assert set(pods) == set(tasks), (pods, tasks)
    assert {node.get("plugin") for node in tasks.values()} == {"container"}, tasks
    _assert_nodes_did_their_work(setup, execution,
                                 {node["task"]: node_id for node_id, node in tasks.items()}, connector=False)
    _assert_back_at_baseline(setup)
