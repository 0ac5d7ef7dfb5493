"""The process kubelet on a real kube-apiserver: pods run as local processes and end as a kubelet reports it.

A control plane of this module's own (etcd, kube-apiserver,
controller-manager; no DCO stand-in), with the envtest tier's fake kubelet
beside the process kubelet, as the flyte tier runs them: the fake one told
to leave the process kubelet's namespace alone. The containers run
``kubelet-probe`` (written here into the folder given as
``executable_dir``), which talks to the test over a Unix socket: it says
when it is ready and which processes it runs, and reports a SIGTERM.
"""
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from tests.envtest.controlplane import ENV_DIR, ControlPlane, missing_requirements
from tests.envtest.dask_runtime import ClusterDns
from tests.envtest.kubelet import FakeKubelet
from tests.flyte_tier.process_kubelet import UNSUPPORTED, ProcessKubelet

pytestmark = [pytest.mark.envtest, pytest.mark.own_control_plane, pytest.mark.flyte]

RUN = "processes"
"""The process kubelet's namespace."""
OTHERS = "others"
"""A namespace of the fake kubelet."""
TIMEOUT = 30.0
"""Seconds a pod may take to reach a state (the process's start included)."""
GRACE = 2
"""terminationGracePeriodSeconds of the pod that ignores SIGTERM."""

PROBE = '''#!{python}
"""The test's container program: kubelet-probe MODE [...]."""
import json, os, signal, socket, subprocess, sys

mode = sys.argv[1]
if mode == "write":  # write: what the process sees, to $PROBE_OUT; exit 0
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump({{"cwd": os.getcwd(), "env": dict(os.environ), "argv": sys.argv,
                   "hosts": open("/etc/hosts").read()}}, out)
    print("wrote", os.environ["PROBE_OUT"], flush=True)
    sys.exit(0)
if mode == "exit":  # exit N
    print("exiting with", sys.argv[2], flush=True)
    sys.exit(int(sys.argv[2]))
# wait [--ignore-term] [--children]: say READY <pids>, report SIGTERM, wait for signals
channel = socket.socket(socket.AF_UNIX)
channel.connect(os.environ["PROBE_SOCKET"])
def on_term(signo, frame):
    channel.sendall(b"TERM\\n")
    if "--ignore-term" not in sys.argv:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
pids = [os.getpid()]
if "--children" in sys.argv:  # one in the process group, one in a session of its own
    pause = [sys.executable, "-c", "import signal; signal.pause()"]
    pids.append(subprocess.Popen(pause).pid)
    pids.append(subprocess.Popen(pause, start_new_session=True).pid)
channel.sendall(("READY " + " ".join(map(str, pids)) + "\\n").encode())
while True:
    request = channel.recv(100)
    if request == b"ALIVE?\\n":
        channel.sendall(b"ALIVE\\n")
    elif not request:
        signal.pause()
'''


class Channel:
    """The test's end of a probe's Unix socket: accepts one probe, reads its lines."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="pk-", dir="/tmp")  # short: a socket path has 108 bytes at most
        self.path = os.path.join(self.folder, "probe.sock")
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.path)
        self.server.listen(1)
        self.connection: Optional[socket.socket] = None
        self.buffer = b""

    def line(self, what: str, timeout: float = TIMEOUT) -> str:
        """The probe's next line, waiting at most ``timeout`` s for it (``what``: the line awaited)."""
        deadline = time.monotonic() + timeout
        if self.connection is None:
            self.server.settimeout(timeout)
            try:
                self.connection, _ = self.server.accept()
            except socket.timeout:
                raise AssertionError(f"the probe did not connect within {timeout:.0f} s (waiting for {what})")
        while b"\n" not in self.buffer:
            self.connection.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.connection.recv(100)
            except socket.timeout:
                raise AssertionError(f"no {what} from the probe within {timeout:.0f} s")
            if not chunk:
                raise AssertionError(f"the probe closed its socket before {what}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def send(self, text: str) -> None:
        assert self.connection is not None
        self.connection.sendall(text.encode() + b"\n")

    def close(self) -> None:
        for end in (self.connection, self.server):
            if end is not None:
                end.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Plane:
    """The module's control plane, kubelets and folders."""

    def __init__(self, control: ControlPlane, admin: Any, kubelet: ProcessKubelet, fake: FakeKubelet,
                 work_root: Path, bin_dir: Path, dns: Optional[ClusterDns]) -> None:
        from kubernetes import client

        self.control = control
        self.admin = admin
        self.core = client.CoreV1Api(admin)
        self.kubelet = kubelet
        self.fake = fake
        self.work_root = work_root
        self.bin_dir = bin_dir
        self.dns = dns
        """The hosts file the process kubelet's pods see as /etc/hosts (None where no mount namespace can be had)."""

    def create(self, name: str, args: Optional[List[str]] = None, namespace: str = RUN, grace: Optional[int] = None,
               containers: Optional[List[Dict[str, Any]]] = None, **container: Any) -> str:
        """Create a pod (restartPolicy Never) of one container ``main`` running ``args`` with ``container``'s
        fields (or of ``containers``); returns its resourceVersion (to follow it from its creation on)."""
        main = dict({"name": "main", "image": "probe"}, **container)
        if args is not None:
            main["args"] = args
        spec: Dict[str, Any] = {"restartPolicy": "Never", "containers": containers or [main]}
        if grace is not None:
            spec["terminationGracePeriodSeconds"] = grace
        made = self.core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": spec})
        return made.metadata.resource_version

    def follow(self, name: str, until: Callable[[str, Dict[str, Any]], bool], what: str,
               namespace: str = RUN, timeout: float = TIMEOUT, since: Optional[str] = None) -> List[Dict[str, Any]]:
        """Watch the pod (from its state now, or its changes after resourceVersion ``since``) until
        ``until(event type, pod)`` holds; returns the pod's states seen so far (last: that one). Fails saying
        ``what`` was awaited and the last state, after ``timeout`` s."""
        from kubernetes import watch

        deadline = time.monotonic() + timeout
        seen: List[Dict[str, Any]] = []
        version = since
        while time.monotonic() < deadline:
            left = deadline - time.monotonic()
            options: Dict[str, Any] = {"field_selector": f"metadata.name={name}",
                                       "timeout_seconds": max(1, int(left)), "_request_timeout": left + 5}
            if version:
                options["resource_version"] = version
            stream = watch.Watch()
            for event in stream.stream(self.core.list_namespaced_pod, namespace, **options):
                pod = self.admin.sanitize_for_serialization(event["object"])
                version = pod["metadata"]["resourceVersion"]
                seen.append(pod)
                if until(event["type"], pod):
                    stream.stop()
                    return seen
        last = json.dumps(seen[-1].get("status"), indent=1) if seen else "(no event)"
        raise AssertionError(f"{namespace}/{name}: {what} not within {timeout:.0f} s; last status: {last}; "
                             f"kubelet errors: {self.kubelet.errors}")

    def phase(self, name: str, phase: str, namespace: str = RUN) -> Dict[str, Any]:
        """The pod once its phase is ``phase``."""
        return self.follow(name, lambda _, pod: (pod.get("status") or {}).get("phase") == phase,
                           f"phase {phase}", namespace)[-1]

    def gone(self, name: str, timeout: float = TIMEOUT) -> List[Dict[str, Any]]:
        """The pod's states until it was removed (the last: as it was removed)."""
        return self.follow(name, lambda kind, _: kind == "DELETED", "its removal", timeout=timeout)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """A control plane of this module's own with the fake kubelet (all but :data:`RUN`) and the process
    kubelet (:data:`RUN`), its ``executable_dir`` holding ``kubelet-probe``, its pods seeing a hosts file of
    their own as the flyte tier's do (where a private mount namespace can be had)."""
    reasons = missing_requirements()
    if reasons:
        pytest.skip(f"envtest tier (real kube-apiserver) not run: {'; '.join(reasons)}")
    root = tmp_path_factory.mktemp("process-kubelet")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    probe = bin_dir / "kubelet-probe"
    probe.write_text(PROBE.format(python=sys.executable))
    probe.chmod(0o755)
    (bin_dir / "pyflyte-fast-execute").symlink_to(Path(sys.executable).parent / "pyflyte-fast-execute")
    dns = ClusterDns(root / "cluster.hosts") if ClusterDns.available() else None
    with ControlPlane(Path(os.environ[ENV_DIR])) as control:
        admin = control.api_client()
        try:
            from kubernetes import client

            for namespace in (RUN, OTHERS):
                client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace}})
            with contextlib.ExitStack() as stack:
                fake = FakeKubelet(admin, ready_delay=0.0, exclude_namespaces=[RUN]).start()
                stack.callback(fake.stop)
                kubelet = stack.enter_context(ProcessKubelet(
                    admin, namespaces=[RUN], executable_dir=bin_dir, work_root=root / "pods",
                    extra_env={"FROM_KUBELET": "extra", "OVERRIDDEN": "by-kubelet"},
                    hosts=None if dns is None else dns.path))
                yield Plane(control, admin, kubelet, fake, root / "pods", bin_dir, dns)
        finally:
            admin.close()


@pytest.fixture
def channel() -> Iterator[Channel]:
    made = Channel()
    try:
        yield made
    finally:
        made.close()


def terminated(pod: Dict[str, Any]) -> Dict[str, Any]:
    """The terminated state of the pod's one container ({} while it has none)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return (statuses[0].get("state") or {}).get("terminated") or {}


def pid_of(pod: Dict[str, Any]) -> int:
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    assert container_id.startswith("process://"), container_id
    return int(container_id[len("process://"):])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_a_pod_runs_its_args_with_its_env_and_working_dir_and_succeeds(plane, tmp_path):
    outputs = {name: tmp_path / f"{name}.json" for name in ("args-only", "command-and-args")}
    env = [{"name": "PLAIN", "value": "plain"}, {"name": "OVERRIDDEN", "value": "by-pod"},
           {"name": "EXPANDED", "value": "$(PLAIN)-and-$$(PLAIN)"},
           {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    chosen = tmp_path / "chosen" / "dir"
    created = {
        "args-only": plane.create("args-only", ["kubelet-probe", "write", "$(PLAIN)"],
                                  env=env + [{"name": "PROBE_OUT", "value": str(outputs["args-only"])}]),
        "command-and-args": plane.create(
            "command-and-args", ["write"], command=["kubelet-probe"], workingDir=str(chosen),
            env=env + [{"name": "PROBE_OUT", "value": str(outputs["command-and-args"])}]),
    }

    seen = {}
    for name in outputs:
        states = plane.follow(name, lambda _, pod: (pod.get("status") or {}).get("phase") == "Succeeded",
                              "phase Succeeded", since=created[name])
        assert any((s.get("status") or {}).get("phase") == "Running" for s in states), "never reported Running"
        pod = states[-1]
        assert pod["spec"]["nodeName"] == "envtest-node"
        state = terminated(pod)
        assert (state["exitCode"], state["reason"]) == (0, "Completed")
        assert state["startedAt"] <= state["finishedAt"]
        conditions = {c["type"]: (c["status"], c.get("reason")) for c in pod["status"]["conditions"]}
        assert conditions["Ready"] == ("False", "PodCompleted") and conditions["PodScheduled"][0] == "True"
        seen[name] = json.loads(outputs[name].read_text())
        assert f"wrote {outputs[name]}" in plane.kubelet.logs(RUN, name)

    for name, report in seen.items():
        variables = report["env"]
        assert variables["PLAIN"] == "plain" and variables["EXPANDED"] == "plain-and-$(PLAIN)"
        assert (variables["POD_NAME"], variables["POD_NAMESPACE"], variables["POD_IP"]) == (name, RUN, "127.0.0.1")
        assert variables["FROM_KUBELET"] == "extra" and variables["OVERRIDDEN"] == "by-pod"
        assert variables["PATH"].split(os.pathsep)[0] == str(plane.bin_dir)
        assert ENV_DIR not in variables, "the test process's environment leaked into the pod's"
    assert seen["args-only"]["argv"][1:] == ["write", "plain"]  # args[0] is the program, $(PLAIN) expanded
    assert seen["command-and-args"]["argv"][1:] == ["write"]
    assert seen["command-and-args"]["cwd"] == str(chosen)
    own = Path(seen["args-only"]["cwd"])
    assert own.is_relative_to(plane.work_root) and own != plane.work_root


def test_pods_see_the_hosts_file_as_etc_hosts(plane, tmp_path):
    if plane.dns is None:
        pytest.skip("no private mount namespace here (unshare -rm): the process kubelet's hosts= cannot apply")
    plane.dns.serve("example-scheduler", "some-namespace", "127.0.0.7")
    output = tmp_path / "report.json"
    plane.create("hosts", ["kubelet-probe", "write"], env=[{"name": "PROBE_OUT", "value": str(output)}])
    plane.phase("hosts", "Succeeded")
    assert "127.0.0.7 example-scheduler.some-namespace.svc\n" in json.loads(output.read_text())["hosts"]


def test_a_nonzero_exit_fails_the_pod_with_its_code_and_reason_error(plane):
    plane.create("exit-3", ["kubelet-probe", "exit", "3"])
    pod = plane.phase("exit-3", "Failed")
    state = terminated(pod)
    assert (state["exitCode"], state["reason"]) == (3, "Error")
    assert not pod["status"].get("reason"), "a kubelet sets no pod reason for a container's failure"
    assert {c["type"]: (c["status"], c.get("reason")) for c in pod["status"]["conditions"]}["Ready"] == (
        "False", "PodFailed")
    assert "exiting with 3" in plane.kubelet.logs(RUN, "exit-3")


def test_a_process_killed_from_outside_fails_with_128_plus_the_signal(plane, channel):
    plane.create("killed", ["kubelet-probe", "wait"], env=[{"name": "PROBE_SOCKET", "value": channel.path}])
    ready = channel.line("READY")
    running = plane.phase("killed", "Running")
    assert ready == f"READY {pid_of(running)}"
    os.kill(pid_of(running), signal.SIGKILL)
    state = terminated(plane.phase("killed", "Failed"))
    assert (state["exitCode"], state["reason"]) == (137, "Error")


def test_a_program_not_found_fails_the_pod_as_a_start_error(plane):
    plane.create("not-found", ["no-such-program-here"])
    state = terminated(plane.phase("not-found", "Failed"))
    assert (state["exitCode"], state["reason"]) == (128, "StartError")
    assert "no-such-program-here" in state["message"]


@pytest.mark.parametrize("name, fields, words", [
    ("two-containers", {"containers": [{"name": name, "image": "i", "args": ["x"]} for name in ("a", "b")]},
     ["one container", "2", "a, b"]),
    ("secret-env", {"env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
     ["TOKEN", "secretKeyRef"]),
])
def test_a_pod_it_cannot_run_fails_at_once_saying_what(plane, name, fields, words):
    plane.create(name, ["kubelet-probe", "exit", "0"], **fields)
    pod = plane.phase(name, "Failed")
    assert pod["status"]["reason"] == UNSUPPORTED
    for word in words:
        assert word in pod["status"]["message"]
    with pytest.raises(LookupError):
        plane.kubelet.logs(RUN, name)


def test_deleting_a_running_pod_sends_sigterm_and_removes_it_once_ended(plane, channel):
    plane.create("deleted", ["kubelet-probe", "wait"], env=[{"name": "PROBE_SOCKET", "value": channel.path}])
    channel.line("READY")
    plane.phase("deleted", "Running")
    plane.core.delete_namespaced_pod("deleted", RUN)
    assert channel.line("TERM") == "TERM"
    states = plane.gone("deleted")
    final = terminated(states[-1])
    assert (final["exitCode"], final["reason"]) == (0, "Completed"), "the end is written before the removal"


def test_a_pod_of_flytes_shape_gets_sigterm_through_pyflyte_fast_execute(plane, channel):
    """Args as FlytePropeller writes them (``pyflyte-fast-execute ... -- <task command>``): the SIGTERM sent to
    the container's first process reaches the task command, which flytekit's wrapper runs as its child."""
    plane.create("flyte-shaped", ["pyflyte-fast-execute", "--dest-dir", ".", "--", "kubelet-probe", "wait"],
                 env=[{"name": "PROBE_SOCKET", "value": channel.path}])
    ready = channel.line("READY")
    running = plane.phase("flyte-shaped", "Running")
    assert ready != f"READY {pid_of(running)}", "the task command is the wrapper's child, not the first process"
    plane.core.delete_namespaced_pod("flyte-shaped", RUN)
    assert channel.line("TERM") == "TERM"
    final = terminated(plane.gone("flyte-shaped")[-1])
    assert (final["exitCode"], final["reason"]) == (0, "Completed")


def test_a_program_ignoring_sigterm_is_killed_after_the_grace_period(plane, channel):
    plane.create("stubborn", ["kubelet-probe", "wait", "--ignore-term"], grace=GRACE,
                 env=[{"name": "PROBE_SOCKET", "value": channel.path}])
    channel.line("READY")
    plane.phase("stubborn", "Running")
    plane.core.delete_namespaced_pod("stubborn", RUN)
    assert channel.line("TERM") == "TERM"
    channel.send("ALIVE?")
    assert channel.line("ALIVE") == "ALIVE", "killed at once, not after the grace period"
    # Well before the default 30 s: the pod's own grace period is honoured.
    final = terminated(plane.gone("stubborn", timeout=GRACE + 20)[-1])
    assert (final["exitCode"], final["reason"]) == (137, "Error")


def test_the_fake_kubelet_leaves_the_process_kubelets_namespace_alone(plane):
    plane.create("finished", ["kubelet-probe", "exit", "0"])
    plane.phase("finished", "Succeeded")
    plane.create("elsewhere", namespace=OTHERS, args=["anything"])
    # The fake kubelet readies this pod in a pass that listed the finished one too.
    plane.follow("elsewhere", lambda _, pod: any(c["type"] == "Ready" and c["status"] == "True"
                                                 for c in (pod.get("status") or {}).get("conditions") or []),
                 "Ready from the fake kubelet", namespace=OTHERS)
    with pytest.raises(LookupError):
        plane.kubelet.logs(OTHERS, "elsewhere")
    pod = plane.admin.sanitize_for_serialization(plane.core.read_namespaced_pod("finished", RUN))
    assert pod["status"]["phase"] == "Succeeded", "the fake kubelet rewrote a finished pod of the process kubelet"


def test_stop_leaves_no_process_of_any_pod_running(plane, channel, tmp_path):
    from kubernetes import client

    namespace = "stopped"
    client.CoreV1Api(plane.admin).create_namespace({"metadata": {"name": namespace}})
    plane.fake.exclude_namespaces.add(namespace)
    kubelet = ProcessKubelet(plane.admin, namespaces=[namespace], executable_dir=plane.bin_dir,
                             work_root=tmp_path / "pods").start()
    try:
        plane.create("many", ["kubelet-probe", "wait", "--children", "--ignore-term"], namespace=namespace,
                     env=[{"name": "PROBE_SOCKET", "value": channel.path}])
        pids = [int(word) for word in channel.line("READY").split()[1:]]
        assert len(pids) == 3 and all(alive(pid) for pid in pids)
    finally:
        kubelet.stop()
    assert [pid for pid in pids if alive(pid)] == []
