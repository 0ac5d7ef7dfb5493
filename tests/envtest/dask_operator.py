"""The real Dask operator (``dask-kubernetes`` from PyPI, under kopf) against the envtest tier's API server.

``RealDaskOperator`` runs ``kopf run --standalone --all-namespaces -m
dask_kubernetes.operator.controller`` as a child process with the admin
kubeconfig. It makes DaskClusters into a scheduler Deployment and Service,
the default DaskWorkerGroup and one worker Deployment per worker; the
controller-manager makes their pods and the fake kubelet makes them Ready.

Known limit here (no cluster DNS, no real scheduler): the operator retires
workers through the scheduler's Service, which resolves nowhere, so a
scale-down is retried by kopf (every 60 s) and removes no worker. Only what
needs no scheduler is tested against it.
"""
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .controlplane import SUITE, SUITE_ENV, _die_with_parent

START_TIMEOUT = 60.0


class RealDaskOperator:
    """The Dask operator as a child process; ``log`` is its output, for a failing test's message."""

    def __init__(self, kubeconfig: Path, work: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log = work / "dask-operator.log"
        self._process: Optional[subprocess.Popen] = None

    def start(self) -> "RealDaskOperator":
        """Start the operator and wait (at most 60 s) until kopf says it is watching."""
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), **{SUITE_ENV: str(SUITE)})
        with open(self.log, "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces",
                 "-m", "dask_kubernetes.operator.controller"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent,
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
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)

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
