"""The flyte tier's control plane: the real FlytePropeller v1.16.8 running flows on a real kube-apiserver.

:class:`FlytePlane` starts, as one unit and stopped as one:

* the envtest control plane (etcd, kube-apiserver, kube-controller-manager: :mod:`tests.envtest`);
* an S3 store (moto's server) holding the bucket the sandbox uses, ``my-s3-bucket``;
* the connector as its image runs it: a stock ``pyflyte serve connector`` (``connector=True``);
* FlytePropeller built from its Go module (``tests/flyte_tier/build_peers.sh``), configured with the
  sandbox's own configuration files (:mod:`tests.flyte_tier.sandbox_config`) and, for the connector, the
  block docs/sandbox.md tells users to add;
* the process kubelet (:mod:`tests.flyte_tier.process_kubelet`) running task pods of
  ``flytesnacks-development`` as local processes;
* :class:`~tests.flyte_tier.admin_events.EventRecorder` in flyteadmin's place for the events.

:meth:`FlytePlane.run` starts an execution as flyteadmin would hand it over (a FlyteWorkflow made by
FlytePropeller's own ``kubectl-flyte create`` from the flow's compiled closure and inputs) and waits
for its end. ``python -m tests.flyte_tier.plane`` starts it by hand (docs/development.md).
"""
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from tests.envtest.controlplane import SETPRIV, SUITE, SUITE_ENV, ControlPlane, _die_with_parent
from tests.envtest.dask_runtime import seeing_hosts
from tests.flyte_tier import sandbox_config
from tests.flyte_tier.admin_events import EventRecorder
from tests.flyte_tier.peers import Peers
from tests.flyte_tier.process_kubelet import ProcessKubelet
from tests.port_support import free_ports
from tests.served_process import stop_process, wait_serving

ROOT = Path(__file__).resolve().parents[2]
PROJECT, DOMAIN = "flytesnacks", "development"
NAMESPACE = f"{PROJECT}-{DOMAIN}"
BUCKET = "my-s3-bucket"
S3_KEYS = {"FLYTE_AWS_ACCESS_KEY_ID": "minio", "FLYTE_AWS_SECRET_ACCESS_KEY": "miniostorage"}
START_TIMEOUT = 90.0

PHASES = ["Ready", "Running", "Succeeding", "Success", "Failing", "Failed", "Aborted", "HandlingFailureNode"]
"""FlytePropeller's WorkflowPhase values, in order (pkg/apis/flyteworkflow/v1alpha1/iface.go)."""
TERMINAL = {"Success", "Failed", "Aborted"}
NODE_PHASES = ["NotYetStarted", "Queued", "Running", "Failing", "Succeeding", "Succeeded", "Failed", "Skipped",
               "RetryableFailure", "TimingOut", "TimedOut", "DynamicRunning", "Recovered"]
"""FlytePropeller's NodePhase values, in order (pkg/apis/flyteworkflow/v1alpha1/iface.go)."""


@dataclass
class Execution:
    """An execution's end as FlytePropeller left it on its FlyteWorkflow object."""

    name: str
    phase: str
    message: str
    nodes: Dict[str, Dict[str, Any]]
    """Each node's status (``phase``, ``message``, attempts ...) as FlytePropeller writes it."""


class FlytePlane:
    """The running tier (see the module's text); a context manager. ``connector`` False leaves the
    connector out and the guide's block unwritten: every ``ddlscale_*`` node then runs as a pod.
    ``connector_env`` and ``pod_env`` are added to the connector's and every task pod's environment. Both
    reach the API server as the envtest tier's non-admin user (``KUBECONFIG``: its kubeconfig, the stand-in for
    a pod's service account), which has no rights until a test grants a shipped Role to it. ``hosts``: a hosts
    file the connector and every task pod see as ``/etc/hosts``, cluster DNS's stand-in
    (:class:`~tests.envtest.dask_runtime.ClusterDns`); None: the machine's. ``projects``: the Flyte projects whose
    executions run here, each in its namespace ``<project>-development`` (made, and its pods run by the kubelet)."""

    def __init__(self, peers: Peers, envtest_dir: Path, *, connector: bool = True,
                 connector_env: Optional[Dict[str, str]] = None, pod_env: Optional[Dict[str, str]] = None,
                 work: Optional[Path] = None, hosts: Optional[Path] = None, projects: Sequence[str] = (PROJECT,)) -> None:
        self.peers = peers
        self.namespaces = [f"{project}-{DOMAIN}" for project in projects]
        self._namespace_of: Dict[str, str] = {}
        """Execution name -> the namespace it runs in (``<project>-development``)."""
        self.hosts = hosts
        self.envtest_dir = Path(envtest_dir)
        self.connector = connector
        self.connector_env = dict(connector_env or {})
        self.extra_pod_env = dict(pod_env or {})
        self._own_work = work is None
        self.work = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="ddlscale-flyte-"))
        self.state_dir = self.work / "ddlscale-state"
        self.events = EventRecorder()
        self._stack = contextlib.ExitStack()
        self._processes: Dict[str, subprocess.Popen] = {}
        self.kube: Optional[ControlPlane] = None
        self.kubelet: Optional[ProcessKubelet] = None
        self.s3_port = 0
        self.connector_port = 0
        self.connector_metrics_port = 0

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> "FlytePlane":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.kube = self._stack.enter_context(ControlPlane(self.envtest_dir, work=self.work / "k8s"))
        self.admin = self.kube.api_client()
        self._stack.callback(self.admin.close)
        self._make_namespace()
        self._stack.enter_context(self.events)
        self._start_s3()
        if self.connector:
            self._start_connector()
        self._start_propeller()
        self.kubelet = self._stack.enter_context(ProcessKubelet(
            self.admin, namespaces=self.namespaces, executable_dir=Path(sys.executable).parent,
            work_root=self.work / "pods", extra_env=self.pod_env(), hosts=self.hosts))

    def close(self) -> None:
        """Stop everything started (propeller first, so nothing acts on a half-stopped plane), then take down
        the local clusters the connector or the pods left."""
        for name in reversed(list(self._processes)):
            stop_process(self._processes.pop(name), 10)
        self._stack.close()
        if self.state_dir.is_dir():
            subprocess.run([str(Path(sys.executable).with_name("ddlscale")), "local", "down", "--all"],
                           env=dict(os.environ, DDLSCALE_STATE_DIR=str(self.state_dir)), capture_output=True,
                           timeout=120)
        if self._own_work:
            shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> "FlytePlane":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the parts ---------------------------------------------------------
    def pod_env(self) -> Dict[str, str]:
        """What the process kubelet adds to a task pod's env: what an image and the cluster give a real pod
        (the project's code on PYTHONPATH, as an image holds it; a HOME; the local backend's state folder,
        which the connector shares, as a mounted volume would)."""
        return {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                "PYTHONPATH": str(ROOT), "DDLSCALE_STATE_DIR": str(self.state_dir),
                "KUBECONFIG": str(self.kube.user_kubeconfig), SUITE_ENV: str(SUITE), **self.extra_pod_env}

    def _make_namespace(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.admin)
        for namespace in self.namespaces:
            core.create_namespace({"metadata": {"name": namespace}})
            core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})

    def _spawn(self, name: str, argv: List[str], env: Dict[str, str]) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "ab")
        # setpriv sets the parent-death signal and execs: no Python runs in the forked child while the
        # event recorder's gRPC threads run (see tests.envtest.controlplane.SETPRIV).
        prefix = [SETPRIV, "--pdeathsig", "TERM", "--"] if SETPRIV else []
        with log:
            process = subprocess.Popen(
                prefix + argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.work,
                env=dict(env, **{SUITE_ENV: str(SUITE)}), preexec_fn=None if SETPRIV else _die_with_parent)
        self._processes[name] = process
        return process

    def log(self, name: str, size: int = 4000) -> str:
        """The end of a process's log (``s3``, ``connector``, ``flytepropeller``)."""
        try:
            return (self.work / f"{name}.log").read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def _start_s3(self) -> None:
        import boto3

        self.s3_port, = free_ports(1)
        process = self._spawn("s3", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.s3_port)],
                              dict(os.environ))
        s3 = boto3.client("s3", endpoint_url=self.s3_url, region_name="us-east-1",
                          aws_access_key_id=S3_KEYS["FLYTE_AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=S3_KEYS["FLYTE_AWS_SECRET_ACCESS_KEY"])
        _until(lambda: _bucket_made(s3, BUCKET), process, "moto's S3 server to create the bucket", self.log, "s3")

    @property
    def s3_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def _start_connector(self) -> None:
        import grpc

        self.connector_port, self.connector_metrics_port = free_ports(2)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DDLSCALE_", "CLUSTER_SCALER", "DOMINO_"))}
        env.update(DDLSCALE_STATE_DIR=str(self.state_dir), PYTHONPATH=str(ROOT),
                   KUBECONFIG=str(self.kube.user_kubeconfig), **self.connector_env)
        argv = [str(Path(sys.executable).with_name("pyflyte")), "serve", "connector",
                "--port", str(self.connector_port), "--prometheus_port", str(self.connector_metrics_port)]
        process = self._spawn("connector", argv if self.hosts is None else seeing_hosts(self.hosts, argv), env)
        channel = grpc.insecure_channel(f"127.0.0.1:{self.connector_port}")
        with open(self.work / "connector.log", "rb") as log:
            try:
                exited = wait_serving(channel, process, log, START_TIMEOUT, "pyflyte serve connector")
            finally:
                channel.close()
            if exited is not None:
                raise AssertionError(f"pyflyte serve connector exited with {process.returncode}: {exited}")

    def _start_propeller(self) -> None:
        config = self.work / "config"
        config.mkdir()
        prof_port, = free_ports(1)
        files = sandbox_config.files(
            kubeconfig=self.kube.admin_kubeconfig, admin=f"dns:///127.0.0.1:{self.events.port}",
            s3_url=self.s3_url, bucket=BUCKET, keys=S3_KEYS, prof_port=prof_port,
            connector=f"dns:///127.0.0.1:{self.connector_port}" if self.connector else None)
        for name, text in files.items():
            (config / name).write_text(text)
        process = self._spawn("flytepropeller", [
            str(self.peers.flytepropeller), "--config", str(config / "*.yaml")], dict(os.environ))
        _until(lambda: "Started workers" in self.log("flytepropeller", 200000), process,
               "FlytePropeller to start its workers", self.log, "flytepropeller")

    def connector_calls(self, operation: str, task_type: str) -> int:
        """How many ``operation`` calls (create, get, delete) for ``task_type`` the connector answered so far,
        from flytekit's own metrics (``flyte_connector_requests_success_total``)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"http://127.0.0.1:{self.connector_metrics_port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        return sum(int(sample.value) for family in text_string_to_metric_families(text)
                   for sample in family.samples if sample.name == "flyte_connector_requests_success_total"
                   and sample.labels == {"operation": operation, "task_type": task_type})

    # -- executions --------------------------------------------------------
    def run(self, workflow: Any, inputs: Dict[str, Any], *, timeout: float = 180.0, name: Optional[str] = None,
            project: str = PROJECT) -> Execution:
        """Start ``workflow`` (a flytekit workflow) with ``inputs`` as an execution of ``project``/development
        and wait at most ``timeout`` s for its end."""
        name = name or f"e{secrets.token_hex(4)}"
        self.submit(workflow, inputs, name, project)
        return self.wait(name, timeout)

    def submit(self, workflow: Any, inputs: Dict[str, Any], name: str, project: str = PROJECT) -> None:
        """Hand the execution to FlytePropeller: ``kubectl-flyte create`` compiles the closure (registered in
        ``project``/development, which the execution takes) and makes its FlyteWorkflow object in the project's
        namespace, as flyteadmin does for ``CreateExecution``."""
        folder = self.work / "executions" / name
        folder.mkdir(parents=True)
        closure, literals = compiled(workflow, inputs, project)
        self._namespace_of[name] = f"{project}-{DOMAIN}"
        (folder / "closure.pb").write_bytes(closure)
        (folder / "inputs.pb").write_bytes(literals)
        done = subprocess.run(
            [str(self.peers.kubectl_flyte), "create", "--kubeconfig", str(self.kube.admin_kubeconfig),
             "--namespace", self._namespace_of[name], "--proto-path", str(folder / "closure.pb"),
             "--input-path", str(folder / "inputs.pb"), "--execution-id", name],
            capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise AssertionError(f"kubectl-flyte create failed ({done.returncode}): {done.stdout}{done.stderr}")

    def workflow_object(self, name: str) -> Dict[str, Any]:
        from kubernetes import client

        return client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            "flyte.lyft.com", "v1alpha1", self._namespace_of.get(name, NAMESPACE), "flyteworkflows", name)

    def wait(self, name: str, timeout: float) -> Execution:
        """The execution's end, watched on its FlyteWorkflow object; AssertionError with FlytePropeller's log
        after ``timeout`` s."""
        end = time.monotonic() + timeout
        while True:
            current = self.workflow_object(name)
            ended = _ended(current)
            if ended is not None:
                return ended
            left = end - time.monotonic()
            if left <= 0:
                status = current.get("status") or {}
                raise AssertionError(
                    f"execution {name} did not end within {timeout:g} s (phase {PHASES[status.get('phase', 0)]}, "
                    f"nodes {json.dumps(_node_phases(status))}); FlytePropeller: {self.log('flytepropeller')}")
            for event in self._changes(name, current["metadata"]["resourceVersion"], left):
                if _ended(event["object"]) is not None:
                    break

    def _changes(self, name: str, version: str, left: float) -> Iterator[Dict[str, Any]]:
        """The watch events of FlyteWorkflow ``name`` after ``version``, for at most ``left`` s (30 at a time)."""
        from kubernetes import client, watch

        return watch.Watch().stream(
            client.CustomObjectsApi(self.admin).list_namespaced_custom_object, "flyte.lyft.com", "v1alpha1",
            self._namespace_of.get(name, NAMESPACE), "flyteworkflows", field_selector=f"metadata.name={name}",
            resource_version=version,
            timeout_seconds=max(1, int(min(left, 30))))

    def terminate(self, name: str, timeout: float = 90.0) -> Execution:
        """Terminate execution ``name`` as flyteadmin's ``TerminateExecution`` does (its workflow executor's
        ``Abort`` deletes the FlyteWorkflow object, propagation Background): FlytePropeller's finalizer aborts
        the running nodes (DeleteTask, pods deleted), reports the end to flyteadmin and lets the object go.
        Returns the end as flyteadmin shows it: the phase of the last workflow event (``Aborted``; the object
        never shows it: the update that drops the last finalizer deletes the object as it was), the nodes
        as the object last held them. AssertionError after ``timeout`` s."""
        from flyteidl.core.execution_pb2 import WorkflowExecution
        from kubernetes import client

        api = client.CustomObjectsApi(self.admin)
        last = self.workflow_object(name)
        api.delete_namespaced_custom_object("flyte.lyft.com", "v1alpha1", self._namespace_of.get(name, NAMESPACE),
                                            "flyteworkflows", name,
                                            body=client.V1DeleteOptions(propagation_policy="Background"))
        end = time.monotonic() + timeout
        gone = False
        while not gone:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"execution {name} was not aborted and removed within {timeout:g} s; "
                                     f"FlytePropeller: {self.log('flytepropeller')}")
            for event in self._changes(name, last["metadata"]["resourceVersion"], left):
                last = event["object"]
                if event["type"] == "DELETED":
                    gone = True
                    break
        reported = [e for e in self.events.workflow_events if e.execution_id.name == name]
        phase = WorkflowExecution.Phase.Name(reported[-1].phase) if reported else "UNDEFINED"
        named = {"ABORTED": "Aborted", "FAILED": "Failed", "SUCCEEDED": "Success"}.get(phase, phase)
        status = last.get("status") or {}
        return Execution(name, named, status.get("message", ""), status.get("nodeStatus") or {})

def quick_start(cluster: str) -> Any:
    """The quick start's workflow (``examples/hybrid_flow.py``), on ``cluster`` where this process imports the
    example first (it reads ``DDLSCALE_EXAMPLE_CLUSTER`` at import; the variable is put back after): check the
    module's ``CLUSTER`` for the one it has."""
    saved = os.environ.get("DDLSCALE_EXAMPLE_CLUSTER")
    os.environ["DDLSCALE_EXAMPLE_CLUSTER"] = cluster
    try:
        from examples import hybrid_flow
    finally:
        if saved is None:
            del os.environ["DDLSCALE_EXAMPLE_CLUSTER"]
        else:
            os.environ["DDLSCALE_EXAMPLE_CLUSTER"] = saved
    return hybrid_flow


def compiled(workflow: Any, inputs: Dict[str, Any], project: str = PROJECT) -> "tuple[bytes, bytes]":
    """``workflow``'s closure (its template and every task's) and ``inputs`` (its defaults where left out) as a
    literal map, serialized as flytekit serializes them for registration (the image name is unused: the process
    kubelet runs the args)."""
    from flyteidl.core import workflow_closure_pb2
    from flytekit.configuration import Image, ImageConfig, SerializationSettings
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.core.type_engine import TypeEngine
    from flytekit.models.task import TaskSpec
    from flytekit.tools.translator import get_serializable

    settings = SerializationSettings(
        image_config=ImageConfig(default_image=Image(name="default", fqn="ddlscale-flow", tag="test")),
        project=project, domain=DOMAIN, version="v1", python_interpreter=sys.executable)
    entities: "OrderedDict[Any, Any]" = OrderedDict()
    spec = get_serializable(entities, settings, workflow)
    tasks = [e.template.to_flyte_idl() for e in entities.values() if isinstance(e, TaskSpec)]
    closure = workflow_closure_pb2.WorkflowClosure(workflow=spec.template.to_flyte_idl(), tasks=tasks)
    ctx = FlyteContextManager.current_context()
    # flyteadmin fills what the caller left out from the default launch plan's defaults: so does this.
    given = {**workflow.python_interface.default_inputs_as_kwargs, **inputs}
    literals = TypeEngine.dict_to_literal_map(ctx, given, workflow.python_interface.inputs)
    return closure.SerializeToString(), literals.to_flyte_idl().SerializeToString()


def _ended(obj: Dict[str, Any]) -> Optional[Execution]:
    status = obj.get("status") or {}
    phase = PHASES[status.get("phase", 0)]
    if phase not in TERMINAL:
        return None
    return Execution(obj["metadata"]["name"], phase, status.get("message", ""), status.get("nodeStatus") or {})


def _node_phases(status: Dict[str, Any]) -> Dict[str, Any]:
    return {node: s.get("phase") for node, s in (status.get("nodeStatus") or {}).items()}


def _bucket_made(s3: Any, bucket: str) -> bool:
    try:
        s3.create_bucket(Bucket=bucket)
        return True
    except Exception:  # noqa: BLE001 - not listening yet: asked again
        return False


def _until(ready: Any, process: subprocess.Popen, what: str, log: Any, name: str) -> None:
    """Ask ``ready()`` every 0.2 s until it answers True; AssertionError with the log's end when ``process``
    exits or after :data:`START_TIMEOUT` s."""
    end = time.monotonic() + START_TIMEOUT
    while not ready():
        if process.poll() is not None:
            raise AssertionError(f"{name} exited with {process.returncode} while waiting for {what}: {log(name)}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {START_TIMEOUT:g} s waiting for {what}: {log(name)}")
        time.sleep(0.2)


def _workflow(spec: str) -> Any:
    """``path/to/file.py:workflow`` or ``package.module:workflow`` -> the workflow object."""
    import importlib

    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise SystemExit(f"workflow={spec!r}; allowed: FILE.py:NAME or MODULE:NAME")
    if where.endswith(".py"):
        path = Path(where).resolve()
        try:
            where = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        except ValueError:
            raise SystemExit(f"workflow={spec!r}: the file must be inside {ROOT} (the pods import it from there)")
    return getattr(importlib.import_module(where), name)


def main(argv: Optional[List[str]] = None) -> None:  # pragma: no cover - by hand
    """``python -m tests.flyte_tier.plane [--no-connector] [WORKFLOW [NAME=VALUE ...]]`` (docs/development.md):
    start the tier and, given a workflow, run it once and print its end; else keep it until Ctrl-C."""
    import argparse

    from tests.flyte_tier.peers import find_peers

    parser = argparse.ArgumentParser(prog="python -m tests.flyte_tier.plane", description=main.__doc__.splitlines()[0])
    parser.add_argument("--no-connector", action="store_true", help="every ddlscale_* node runs as a pod")
    parser.add_argument("workflow", nargs="?", help="FILE.py:NAME or MODULE:NAME, inside the repository")
    parser.add_argument("inputs", nargs="*", help="NAME=VALUE (a JSON value, else text)")
    args = parser.parse_args(argv)
    if not os.environ.get("DDLSCALE_ENVTEST_DIR"):
        raise SystemExit("set DDLSCALE_ENVTEST_DIR to the folder of the envtest binaries (docs/envtest.md)")
    peers = find_peers(build=True)
    work = Path(tempfile.mkdtemp(prefix="ddlscale-flyte-"))
    env = {"DDLSCALE_CONNECTOR_BACKENDS": os.environ.get("DDLSCALE_CONNECTOR_BACKENDS", "local")}
    with FlytePlane(peers, Path(os.environ["DDLSCALE_ENVTEST_DIR"]), connector=not args.no_connector,
                    connector_env=env, work=work) as plane:
        print(f"FlytePropeller v1.16.8 is running (configuration: {work / 'config'}; logs: {work}/*.log)")
        print(f"API server: KUBECONFIG={plane.kube.admin_kubeconfig}; task pods in namespace {NAMESPACE}")
        if args.workflow:
            inputs = {}
            for item in args.inputs:
                key, _, value = item.partition("=")
                try:
                    inputs[key] = json.loads(value)
                except ValueError:
                    inputs[key] = value
            ended = plane.run(_workflow(args.workflow), inputs, timeout=600)
            print(f"{ended.name}: {ended.phase} {ended.message}".rstrip())
            for node, status in sorted(ended.nodes.items()):
                print(f"  {node}: {NODE_PHASES[status.get('phase', 0)]} {status.get('message', '')}".rstrip())
            return
        print("Ctrl-C stops everything.")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()
