"""The real Dask operator (``dask-kubernetes`` from PyPI, under kopf) against the envtest tier's API server.

``RealDaskOperator`` runs ``kopf run --standalone --all-namespaces -m
dask_kubernetes.operator.controller`` as a child process with the admin
kubeconfig. It makes DaskClusters into a scheduler Deployment and Service,
the default DaskWorkerGroup and one worker Deployment per worker; the
controller-manager makes their pods and the fake kubelet makes them Ready.

The operator retires workers through the scheduler's Service
(``<cluster>-scheduler.<namespace>``), and this control plane has no cluster
DNS. Where a private mount namespace is allowed (``unshare -rm``), the
operator runs in one whose ``/etc/hosts`` is :attr:`RealDaskOperator.dns`
(:class:`~.dask_runtime.ClusterDns`), so a test can serve a cluster's
scheduler Service at 127.0.0.1 with a real scheduler behind it
(:class:`~.dask_runtime.DaskRuntime`). Nothing else of the machine changes.
Without it (``dns`` None), or for a Service not served, the name resolves
nowhere: the operator retries a scale-down every 60 s and removes no worker.
"""
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .controlplane import SETPRIV, SUITE, SUITE_ENV, _die_with_parent, stop_process
from .dask_runtime import ClusterDns, seeing_hosts

START_TIMEOUT = 60.0


class RealDaskOperator:
    """The Dask operator as a child process; ``log`` is its output, for a failing test's message."""

    def __init__(self, kubeconfig: Path, work: Path, dns: Optional[ClusterDns] = None) -> None:
        self.kubeconfig = kubeconfig
        self.log = work / "dask-operator.log"
        if dns is None and ClusterDns.available():
            dns = ClusterDns(work / "dask-operator.hosts")
        self.dns: Optional[ClusterDns] = dns
        """The operator's /etc/hosts (``dns``, one the caller shares with others, or its own); None where no
        private mount namespace can be had."""
        self._process: Optional[subprocess.Popen] = None

    def start(self) -> "RealDaskOperator":
        """Start the operator and wait (at most 60 s) until kopf says it is watching."""
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), **{SUITE_ENV: str(SUITE)})
        command = [sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces",
                   "-m", "dask_kubernetes.operator.controller"]
        if self.dns is not None:
            command = seeing_hosts(self.dns.path, command)
        # setpriv sets the parent-death signal and execs (see controlplane.SETPRIV).
        prefix = [SETPRIV, "--pdeathsig", "TERM", "--"] if SETPRIV else []
        with open(self.log, "wb") as log:
            self._process = subprocess.Popen(
                prefix + command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=None if SETPRIV else _die_with_parent,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while "Activity 'startup' succeeded" not in self.tail(20000):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Dask operator did not start within {START_TIMEOUT:.0f} s: {self.tail()}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self._process is not None:
            stop_process(self._process)

    def tail(self, size: int = 3000) -> str:
        """The end of the operator's log."""
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def __enter__(self) -> "RealDaskOperator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
