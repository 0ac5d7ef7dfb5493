"""The flyte tier's kubelet: a task pod's container runs as a local process, and its end is the pod's.

:class:`ProcessKubelet` runs the pods of its ``namespaces`` (the envtest
tier's :class:`~tests.envtest.kubelet.FakeKubelet` keeps the others, given
``exclude_namespaces``). For each new pod it binds the pod to :data:`NODE`
(the binding subresource, as the scheduler does: only a bound pod is deleted
gracefully), starts ``spec.containers[0]`` as a process and writes the status
a kubelet writes:

- Running (PodScheduled, Initialized, ContainersReady and Ready True,
  ``podIP`` 127.0.0.1, the container running since ``startedAt``,
  ``containerID`` ``process://<pid>``);
- when the process ends, Succeeded (exit 0, terminated reason ``Completed``)
  or Failed (reason ``Error`` and the exit code; a signal is 128 + its
  number, as the container runtime reports it); a program that cannot be
  started is Failed with reason ``StartError``, exit code 128 (runc's);
- a pod it cannot run as written (more than one container, init containers,
  a restart policy other than Never, ``envFrom``, an unsupported
  ``valueFrom``) is Failed at once, reason :data:`UNSUPPORTED`, the message
  saying what: as the kubelet's admission failures, with no container status.

The process: Kubernetes' ``command``/``args`` (``command`` replaces the
entrypoint; ``args`` alone run ``args[0]``), ``$(VAR)`` expanded from the
container's env, the program looked up on the pod's ``PATH`` (``executable_dir``
first, then the test process's); ``workingDir`` or a fresh ``work`` folder of
the pod's own under ``work_root``; a new session (its own process group);
stdout and stderr to the pod's log (:meth:`ProcessKubelet.logs`). Its
environment is a container's, not the test process's: ``PATH``, ``HOME`` (the
pod's folder), ``HOSTNAME`` (the pod's name), ``LANG``, then ``extra_env``, then
the pod's ``env`` (which wins).

Deletion: on a ``deletionTimestamp`` the main process gets SIGTERM (as the
container runtime sends it: to the container's first process only; a wrapper
such as ``pyflyte-fast-execute`` forwards it), everything of the pod SIGKILL
after ``metadata.deletionGracePeriodSeconds`` (else
``spec.terminationGracePeriodSeconds``, else 30); once it ended, the
terminated status is written and the pod removed with grace 0 (uid
precondition). When the main process ends, whatever else of the pod still
runs is killed, as a container's processes die with its first one. Ignored:
resources, volumes, probes, ports, the image. Only Pending pods are started: a pod
another kubelet left Running stays as it is.
"""
import json
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from tests.envtest.controlplane import SETPRIV, SUITE, SUITE_ENV, _die_with_parent
from tests.envtest.dask_runtime import seeing_hosts
from tests.envtest.kubelet import NODE, Reacting, Reactor, iso_now

UNSUPPORTED = "ProcessKubeletUnsupported"
"""``status.reason`` of a pod refused because the process kubelet cannot run it as written."""
MARKER = "DDLSCALE_PROCESS_KUBELET_POD"
"""Set to the pod's uid in every process of the pod, so its processes are found (and killed) wherever they went."""
DEFAULT_GRACE = 30.0
STOP_TIMEOUT = 10.0
"""Seconds :meth:`ProcessKubelet.stop` waits for the killed processes to be gone."""
FIELDS = {
    "metadata.name": lambda pod: pod["metadata"]["name"],
    "metadata.namespace": lambda pod: pod["metadata"]["namespace"],
    "metadata.uid": lambda pod: pod["metadata"]["uid"],
    "spec.nodeName": lambda pod: NODE,
    "spec.serviceAccountName": lambda pod: pod["spec"].get("serviceAccountName") or "default",
    "status.podIP": lambda pod: "127.0.0.1",
    "status.hostIP": lambda pod: "127.0.0.1",
}
"""``valueFrom.fieldRef.fieldPath`` values the process kubelet fills in (and ``metadata.labels['k']``,
``metadata.annotations['k']``)."""


class Unsupported(ValueError):
    """A pod the process kubelet cannot run as written; the message says what."""


@dataclass
class _Run:
    """One pod's process, from its start to its pod's removal."""

    uid: str
    namespace: str
    name: str
    directory: Path
    container: Dict[str, Any]
    grace: float = DEFAULT_GRACE
    process: Optional["subprocess.Popen[bytes]"] = None
    started_at: str = ""
    finished_at: str = ""
    returncode: Optional[int] = None
    """Set once the main process has ended and the rest of the pod's processes are killed."""
    start_error: str = ""
    reported: str = ""
    """The last status written: "", "Running", "Terminated"."""
    term_at: Optional[float] = None
    killed: bool = False
    gone: bool = False
    waiter: Optional[threading.Thread] = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        return self.directory / "log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.returncode is None


class ProcessKubelet(Reacting):
    """Runs the pods of ``namespaces`` as local processes (see the module's text); a context manager.

    ``api_client``: an admin ``kubernetes.client.ApiClient`` (not closed here);
    ``executable_dir``: the folder searched first for a container's program
    (the project's ``.venv/bin``); ``work_root``: where each pod gets its folder
    (log, ``home``, ``work``); ``extra_env``: added to every pod's process (the
    pod's own ``env`` wins); ``hosts``: a hosts file every pod's processes see as
    ``/etc/hosts`` (a private mount namespace: :func:`~tests.envtest.dask_runtime.seeing_hosts`),
    the names cluster DNS would give them; None: the machine's.
    """

    def __init__(self, api_client: Any, *, namespaces: Iterable[str], executable_dir: Path, work_root: Path,
                 extra_env: Optional[Mapping[str, str]] = None, hosts: Optional[Path] = None) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.namespaces = list(namespaces)
        self.executable_dir = Path(executable_dir)
        self.work_root = Path(work_root)
        self.extra_env = dict(extra_env or {})
        self.hosts = hosts
        self._runs: Dict[str, _Run] = {}
        self._lock = threading.Lock()
        self._stopped = False
        watches = [_bound(self.core.list_namespaced_pod, namespace) for namespace in self.namespaces]
        self._reactor = Reactor("process-kubelet", watches, self._act, period=1.0)

    # -- what tests use ----------------------------------------------------
    def logs(self, namespace: str, name: str) -> str:
        """What the latest pod of that name printed (stdout and stderr), as ``kubectl logs`` shows it;
        LookupError when no such pod was started here."""
        runs = [r for r in list(self._runs.values()) if (r.namespace, r.name) == (namespace, name)]
        if not runs:
            raise LookupError(f"the process kubelet started no pod {namespace}/{name}")
        try:
            return runs[-1].log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """Stop watching, SIGKILL every process of every pod started here and wait until they are gone
        (at most :data:`STOP_TIMEOUT` s each). The pods' statuses are left as they were."""
        self._reactor.stop()
        with self._lock:
            self._stopped = True
        deadline = time.monotonic() + STOP_TIMEOUT
        for run in list(self._runs.values()):
            if run.process is None:
                continue
            _kill_all(run, signal.SIGKILL)
            try:
                run.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for run in list(self._runs.values()):
            if run.waiter is not None:
                run.waiter.join(max(0.1, deadline - time.monotonic()))
        left = [pid for run in self._runs.values() for pid in _members(run.uid)]
        _wait_gone(left, max(0.1, deadline - time.monotonic()))

    def __enter__(self) -> "ProcessKubelet":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the loop ------------------------------------------------------------
    def _act(self) -> Optional[float]:
        pods: List[Dict[str, Any]] = []
        for namespace in self.namespaces:
            pods += json.loads(self.core.list_namespaced_pod(namespace, _preload_content=False).data)["items"]
        now = time.monotonic()
        waits: List[float] = []
        listed = set()
        for pod in pods:
            listed.add(pod["metadata"]["uid"])
            again = self._pod(pod, now)
            if again is not None:
                waits.append(again)
        for uid, run in list(self._runs.items()):
            if uid not in listed and not run.gone:
                # Removed without us (grace 0, or never bound): the kubelet still stops its containers.
                if run.running:
                    again = self._terminate(run, run.grace, now)
                    if again is not None:
                        waits.append(again)
                else:
                    run.gone = True
        return min(waits) if waits else None

    def _pod(self, pod: Dict[str, Any], now: float) -> Optional[float]:
        """Move one listed pod on; returns the seconds until it needs another look (None: at its next change)."""
        meta = pod["metadata"]
        run = self._runs.get(meta["uid"])
        if meta.get("deletionTimestamp"):
            if run is not None and run.running:
                return self._terminate(run, _grace(pod), now)
            if run is not None and run.process is not None and run.reported != "Terminated":
                self._report_end(pod, run)
            self._remove(meta)
            return None
        if run is None:
            if (pod.get("status") or {}).get("phase") in (None, "Pending"):
                self._start(pod)
            return None
        if run.process is not None and not run.running and run.reported != "Terminated":
            self._report_end(pod, run)
        return None

    def _start(self, pod: Dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        meta, spec = pod["metadata"], pod["spec"]
        try:
            if not spec.get("nodeName"):
                self._bind(meta)
            try:
                container, argv, env, cwd = self._container(pod)
            except Unsupported as refused:
                self._patch(meta, {"phase": "Failed", "reason": UNSUPPORTED, "message": str(refused),
                                   "conditions": _conditions("Scheduled"), "startTime": iso_now(),
                                   "hostIP": "127.0.0.1"})
                return
            directory = self.work_root / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
            run = _Run(meta["uid"], meta["namespace"], meta["name"], directory, container, grace=_grace(pod))
            self._runs[run.uid] = run
            self._spawn(run, argv, env, cwd)
            status: Dict[str, Any] = {"startTime": run.started_at, "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
                                      "podIPs": [{"ip": "127.0.0.1"}]}
            if run.process is None:
                status.update(self._ended(run))
                run.reported = "Terminated"
            else:
                running = {"running": {"startedAt": run.started_at}}
                status.update({"phase": "Running", "conditions": _conditions("Running"),
                               "containerStatuses": [_container_status(run, running)]})
                run.reported = "Running"
            self._patch(meta, status)
        except ApiException as exc:
            if exc.status not in (404, 409, 422):  # gone or replaced meanwhile: its process is stopped as an orphan
                raise

    def _container(self, pod: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str], Dict[str, str], Optional[str]]:
        """(container, argv, env, workingDir) of the pod's one container; :class:`Unsupported` when it has more."""
        spec = pod["spec"]
        containers = spec.get("containers") or []
        if len(containers) != 1:
            raise Unsupported(f"the process kubelet runs one container per pod, not {len(containers)} "
                              f"({', '.join(c['name'] for c in containers)})")
        if spec.get("initContainers"):
            raise Unsupported("init containers are not supported by the process kubelet")
        if spec.get("restartPolicy", "Always") != "Never":
            raise Unsupported(f"restartPolicy {spec.get('restartPolicy', 'Always')} is not supported by the "
                              "process kubelet (it runs a container once: restartPolicy Never)")
        container = containers[0]
        if container.get("envFrom"):
            raise Unsupported(f"container {container['name']}: envFrom is not supported by the process kubelet")
        values: Dict[str, str] = {}
        for variable in container.get("env") or []:
            values[variable["name"]] = (_field(pod, container, variable) if variable.get("valueFrom")
                                        else _expand(variable.get("value") or "", values))
        command = [_expand(word, values) for word in container.get("command") or []]
        args = [_expand(word, values) for word in container.get("args") or []]
        argv = command + args
        if not argv:
            raise Unsupported(f"container {container['name']} has neither command nor args: the image's "
                              "entrypoint is not known to the process kubelet")
        return container, argv, values, container.get("workingDir")

    def _spawn(self, run: _Run, argv: List[str], pod_env: Dict[str, str], cwd: Optional[str]) -> None:
        """Start the process (or record why it could not start) in the loop's thread, which lives as long as
        the kubelet: the parent-death signal follows the thread that spawned."""
        (run.directory / "home").mkdir(parents=True, exist_ok=True)
        work = Path(cwd) if cwd else run.directory / "work"
        work.mkdir(parents=True, exist_ok=True)  # runc makes a missing workingDir too
        env = {"PATH": f"{self.executable_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
               "HOME": str(run.directory / "home"), "HOSTNAME": run.name, "LANG": "C.UTF-8"}
        env.update(self.extra_env)
        env.update(pod_env)
        env.update({MARKER: run.uid, SUITE_ENV: str(SUITE)})
        run.started_at = iso_now()
        program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env["PATH"])
        if program is None:
            run.start_error = f'exec: "{argv[0]}": executable file not found in $PATH'
            return
        prefix = [SETPRIV, "--pdeathsig", "TERM", "--"] if SETPRIV else []
        if self.hosts is not None:
            prefix += seeing_hosts(self.hosts, [])
        with self._lock:
            if self._stopped:
                run.start_error = "the process kubelet stopped"
                return
            with open(run.log, "ab") as log:
                try:
                    run.process = subprocess.Popen(
                        prefix + [program] + argv[1:], cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                        stderr=subprocess.STDOUT, start_new_session=True,
                        preexec_fn=None if SETPRIV else _die_with_parent)
                except OSError as exc:
                    run.start_error = f'exec: "{argv[0]}": {exc.strerror}'
                    return
        run.waiter = threading.Thread(target=self._wait, args=(run,), name=f"process-kubelet-{run.name}",
                                      daemon=True)
        run.waiter.start()

    def _wait(self, run: _Run) -> None:
        assert run.process is not None
        code = run.process.wait()
        _kill_all(run, signal.SIGKILL)  # the container's other processes die with its first one
        run.finished_at = iso_now()
        run.returncode = code
        self._reactor.poke()

    def _terminate(self, run: _Run, grace: float, now: float) -> Optional[float]:
        """SIGTERM the main process once; SIGKILL everything of the pod ``grace`` s later. Returns the seconds
        until then (None once killed: its end wakes the loop)."""
        assert run.process is not None
        if run.term_at is None:
            run.term_at = now
            try:
                run.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        run.grace = min(run.grace, grace)  # a second deletion may shorten it, never lengthen it
        due = run.term_at + run.grace
        if due > now:
            return due - now
        if not run.killed:
            run.killed = True
            _kill_all(run, signal.SIGKILL)
        return None

    def _report_end(self, pod: Dict[str, Any], run: _Run) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._patch(pod["metadata"], self._ended(run))
        except ApiException as exc:
            if exc.status not in (404, 409, 422):
                raise
        run.reported = "Terminated"

    def _ended(self, run: _Run) -> Dict[str, Any]:
        """The pod's status once its container ended: the terminated state, the phase, the conditions."""
        if run.process is None:
            terminated = {"exitCode": 128, "reason": "StartError", "message": run.start_error,
                          "startedAt": "1970-01-01T00:00:00Z", "finishedAt": run.started_at}
        else:
            code = run.returncode or 0
            code = code if code >= 0 else 128 - code  # Popen's -N for signal N; the runtime reports 128 + N
            terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                          "startedAt": run.started_at, "finishedAt": run.finished_at,
                          "containerID": f"process://{run.process.pid}"}
        phase = "Succeeded" if terminated["exitCode"] == 0 else "Failed"
        return {"phase": phase, "conditions": _conditions(phase),
                "containerStatuses": [_container_status(run, {"terminated": terminated})]}

    # -- requests ------------------------------------------------------------
    def _bind(self, meta: Dict[str, Any]) -> None:
        from kubernetes import client

        # On the target's uid: a pod recreated under the same name is not bound by mistake.
        binding = client.V1Binding(metadata=client.V1ObjectMeta(name=meta["name"], uid=meta["uid"]),
                                   target=client.V1ObjectReference(kind="Node", name=NODE))
        self.core.create_namespaced_binding(meta["namespace"], binding, _preload_content=False)

    def _patch(self, meta: Dict[str, Any], status: Dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"],
                                              {"metadata": {"uid": meta["uid"]}, "status": status},
                                              _content_type="application/merge-patch+json")

    def _remove(self, meta: Dict[str, Any]) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0,
                                            preconditions=client.V1Preconditions(uid=meta["uid"])))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise


# -- a pod's pieces ------------------------------------------------------------
def _bound(call: Any, namespace: str) -> Any:
    def watch(**kwargs: Any) -> Any:
        return call(namespace, **kwargs)
    watch.__doc__ = call.__doc__  # kubernetes' Watch reads the return type from it
    return watch


def _grace(pod: Dict[str, Any]) -> float:
    meta, spec = pod["metadata"], pod["spec"]
    for value in (meta.get("deletionGracePeriodSeconds"), spec.get("terminationGracePeriodSeconds")):
        if value is not None:
            return float(value)
    return DEFAULT_GRACE


def _field(pod: Dict[str, Any], container: Dict[str, Any], variable: Dict[str, Any]) -> str:
    source = variable["valueFrom"]
    path = (source.get("fieldRef") or {}).get("fieldPath", "")
    if path in FIELDS:
        return str(FIELDS[path](pod))
    for prefix, key in (("metadata.labels['", "labels"), ("metadata.annotations['", "annotations")):
        if path.startswith(prefix) and path.endswith("']"):
            return (pod["metadata"].get(key) or {}).get(path[len(prefix):-2], "")
    what = f"fieldRef {path}" if path else " ".join(sorted(source))
    raise Unsupported(f"container {container['name']}: env {variable['name']} valueFrom {what} is not supported "
                      "by the process kubelet")


def _expand(text: str, values: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined VAR is replaced, an undefined one kept, ``$$`` is ``$``."""
    out, index = [], 0
    while index < len(text):
        if text.startswith("$$", index):
            out.append("$")
            index += 2
            continue
        if text.startswith("$(", index):
            end = text.find(")", index + 2)
            if end != -1:
                name = text[index + 2:end]
                out.append(values.get(name, text[index:end + 1]))
                index = end + 1
                continue
        out.append(text[index])
        index += 1
    return "".join(out)


def _conditions(phase: str) -> List[Dict[str, Any]]:
    """The pod's conditions as the kubelet writes them in ``phase`` ("Scheduled": bound, refused at admission)."""
    stamp = iso_now()
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp}]
    if phase == "Scheduled":
        return conditions
    initialized = {"type": "Initialized", "status": "True", "lastTransitionTime": stamp}
    if phase == "Succeeded":
        initialized["reason"] = "PodCompleted"
    conditions.append(initialized)
    for kind in ("ContainersReady", "Ready"):
        condition: Dict[str, Any] = {"type": kind, "status": "True" if phase == "Running" else "False",
                                     "lastTransitionTime": stamp}
        if phase != "Running":
            condition["reason"] = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        conditions.append(condition)
    return conditions


def _container_status(run: _Run, state: Dict[str, Any]) -> Dict[str, Any]:
    running = "running" in state
    status = {"name": run.container["name"], "image": run.container.get("image") or "", "imageID": "",
              "ready": running, "started": running, "restartCount": 0, "state": state}
    if run.process is not None:
        status["containerID"] = f"process://{run.process.pid}"
    return status


# -- processes -----------------------------------------------------------------
def _members(uid: str) -> List[int]:
    """Pids of the live processes carrying the pod's :data:`MARKER` (its processes, wherever they went)."""
    wanted = f"{MARKER}={uid}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if wanted in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0") and _alive(int(entry)):
                found.append(int(entry))
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _kill_all(run: _Run, signo: int) -> None:
    """Send ``signo`` to the pod's process group and to every process carrying its marker."""
    assert run.process is not None
    try:
        os.killpg(run.process.pid, signo)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in _members(run.uid):
        try:
            os.kill(pid, signo)
        except ProcessLookupError:
            pass


def _wait_gone(pids: List[int], timeout: float) -> None:
    """Wait (at most ``timeout`` s) until each of ``pids`` has ended: its pidfd becomes readable."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            descriptor = os.pidfd_open(pid)
        except OSError:
            continue  # already gone
        try:
            select.select([descriptor], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(descriptor)
