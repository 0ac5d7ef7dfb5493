"""What a node and cluster DNS would give the real Dask operator: a real scheduler and real workers behind its pods.

The envtest tier has no container runtime, no kube-proxy and no cluster DNS.
The operator reaches a cluster's scheduler at ``<cluster>-scheduler.<namespace>``
on the ports its Service declares (the HTTP API on ``http-dashboard``, else
the Dask RPC on ``tcp-comm``), and removes a worker only after retiring it
there. Two stand-ins make that path real:

* :class:`ClusterDns`: the hosts file the operator's process sees as
  ``/etc/hosts`` (a private mount namespace, :func:`seeing_hosts`), naming
  each served scheduler Service at 127.0.0.1 or at a loopback address of
  its own (its ClusterIP's stand-in, so it can serve the manifest's ports);
* :class:`DaskRuntime`: a real ``dask scheduler`` on that address at those
  Service ports, with the HTTP API the operator calls, and one real
  ``dask worker`` per live worker pod of the cluster, named as the operator
  names it (``DASK_WORKER_NAME``, the worker's Deployment), stopped when
  its pod is deleted or terminating, as a kubelet stops a container.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from tests.dask_support import scheduler_workers
from tests.envtest.controlplane import SETPRIV, SUITE, SUITE_ENV, _die_with_parent, stop_process
from tests.envtest.kubelet import Reacting, Reactor
from tests.port_support import free_ports

API_ROUTES = repr(["distributed.http.scheduler.api", "distributed.http.scheduler.json",
                   "distributed.http.health", "distributed.http.scheduler.info"])
"""The scheduler's HTTP routes: the API the operator uses (retire_workers, adaptive_target) and the
JSON the framework check reads; the dask-kubernetes docs tell users to turn the API on the same way
(``DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES``, a Python list literal)."""
START_TIMEOUT = 60.0


class ClusterDns:
    """A hosts file: this machine's ``/etc/hosts`` plus the scheduler Services served here at 127.0.0.1."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._base = Path("/etc/hosts").read_text(errors="replace")
        self._names: List[str] = []
        self._lock = threading.Lock()
        self._write()

    @staticmethod
    def available() -> bool:
        """Whether a process can get a private mount namespace here (``unshare -rm``) to see this file."""
        if shutil.which("unshare") is None:
            return False
        probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return probe.returncode == 0

    def serve(self, service: str, namespace: str, ip: str = "127.0.0.1") -> None:
        """Make ``service`` of ``namespace`` resolve to ``ip``, under the names cluster DNS gives it."""
        with self._lock:
            self._names += [(ip, f"{service}.{namespace}"), (ip, f"{service}.{namespace}.svc"),
                            (ip, f"{service}.{namespace}.svc.cluster.local")]
            self._write()

    def _write(self) -> None:
        # Rewritten in place, never replaced: the operator's /etc/hosts is a bind mount of this inode.
        text = self._base.rstrip("\n") + "\n" + "".join(f"{ip} {name}\n" for ip, name in self._names)
        with open(self.path, "w") as hosts:
            hosts.write(text)


def seeing_hosts(hosts: Path, command: List[str]) -> List[str]:
    """``command`` run in a private mount namespace whose ``/etc/hosts`` is ``hosts`` (see
    :meth:`ClusterDns.available`). unshare, sh and mount exec in turn (no fork), so the pid, the signals and
    the parent-death signal stay the command's; it runs as root of its own user namespace (the caller's uid)."""
    return ["unshare", "--user", "--map-root-user", "--mount", "--", "sh", "-c",
            'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts), *command]


class DaskRuntime(Reacting):
    """A real scheduler for ``cluster`` in ``namespace`` and a real worker for each of its live worker pods.

    The scheduler listens on ``host`` at ``ports`` (comm, dashboard); by default on 127.0.0.1 at two free
    ports, which :meth:`service` then declares."""

    def __init__(self, api_client: Any, namespace: str, cluster: str, work: Path, *, host: str = "127.0.0.1",
                 ports: Optional[Tuple[int, int]] = None) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.cluster = cluster
        self.work = work
        self.host = host
        self.comm_port, self.dashboard_port = ports or free_ports(2)
        self.log = work / f"dask-{namespace}-{cluster}.log"
        self._scheduler: Optional[subprocess.Popen] = None
        self._workers: Dict[str, subprocess.Popen] = {}
        """Running worker processes by the pod's uid."""
        selector = f"dask.org/cluster-name={cluster},dask.org/component=worker"
        self._selector = selector
        self._reactor = Reactor(
            f"dask-runtime-{cluster}",
            [lambda **kw: self.core.list_namespaced_pod(namespace, label_selector=selector, **kw)],
            self._act, period=1.0,
        )

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.comm_port}"

    @property
    def dashboard(self) -> str:
        """The scheduler's HTTP server, as the framework check is given it."""
        return f"http://{self.host}:{self.dashboard_port}"

    def service(self) -> Dict[str, Any]:
        """The DaskCluster's ``spec.scheduler.service``: this scheduler's ports under the operator's port names."""
        return {
            "type": "ClusterIP",
            "selector": {"dask.org/cluster-name": self.cluster, "dask.org/component": "scheduler"},
            "ports": [
                {"name": "tcp-comm", "protocol": "TCP", "port": self.comm_port, "targetPort": "tcp-comm"},
                {"name": "http-dashboard", "protocol": "TCP", "port": self.dashboard_port,
                 "targetPort": "http-dashboard"},
            ],
        }

    def start(self) -> "DaskRuntime":
        """Start the scheduler (at most 60 s until it answers), then the worker pods' watch."""
        env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES=API_ROUTES)
        self._scheduler = self._spawn(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", self.host,
             "--port", str(self.comm_port), "--dashboard-address", f"{self.host}:{self.dashboard_port}"], env)
        deadline = time.monotonic() + START_TIMEOUT
        while scheduler_workers(self.address) is None:
            if self._scheduler.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Dask scheduler did not start within {START_TIMEOUT:.0f} s: {self.tail()}")
            time.sleep(0.2)
        return super().start()

    def registered(self) -> List[str]:
        """The names of the workers registered with the scheduler now (asked over its comm protocol)."""
        return sorted(scheduler_workers(self.address) or {})

    def stop(self) -> None:
        """Stop the watch, every worker, then the scheduler."""
        self._reactor.stop()
        for proc in list(self._workers.values()) + ([self._scheduler] if self._scheduler else []):
            stop_process(proc, grace=15)
        self._workers.clear()

    def tail(self, size: int = 3000) -> str:
        """The end of the scheduler's and workers' log."""
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def _act(self) -> Optional[float]:
        listing = self.core.list_namespaced_pod(self.namespace, label_selector=self._selector, _preload_content=False)
        live = {}
        for pod in json.loads(listing.data)["items"]:
            if not pod["metadata"].get("deletionTimestamp"):
                live[pod["metadata"]["uid"]] = pod
        for uid in [u for u in self._workers if u not in live]:
            stop_process(self._workers.pop(uid), grace=15)
        for uid, pod in live.items():
            if uid not in self._workers:
                self._workers[uid] = self._run_worker(_worker_name(pod))
        return None

    def _run_worker(self, name: str) -> subprocess.Popen:
        return self._spawn(
            [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--name", name,
             "--no-nanny", "--no-dashboard", "--nthreads", "1", "--host", "127.0.0.1",
             "--death-timeout", "30", "--local-directory", str(self.work)], dict(os.environ))

    def _spawn(self, argv: List[str], env: Dict[str, str]) -> subprocess.Popen:
        # setpriv sets the parent-death signal and execs: no Python runs in the forked child while a gRPC
        # server of the test process runs (the flyte tier's event recorder; see controlplane.SETPRIV).
        prefix = [SETPRIV, "--pdeathsig", "TERM", "--"] if SETPRIV else []
        with open(self.log, "ab") as log:
            return subprocess.Popen(
                prefix + argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=dict(env, **{SUITE_ENV: str(SUITE)}), preexec_fn=None if SETPRIV else _die_with_parent)

    def __enter__(self) -> "DaskRuntime":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _worker_name(pod: Dict[str, Any]) -> str:
    """``DASK_WORKER_NAME`` of the pod's first container, as the operator sets it (the pod's name if absent)."""
    for container in pod["spec"]["containers"]:
        for variable in container.get("env") or []:
            if variable.get("name") == "DASK_WORKER_NAME" and variable.get("value"):
                return str(variable["value"])
    return str(pod["metadata"]["name"])


