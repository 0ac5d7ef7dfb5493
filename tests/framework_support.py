"""Helpers for framework-readiness tests: a real Dask scheduler with its HTTP server, and
the scaler test server selected through the environment.

:class:`RealDask` runs ``dask scheduler`` (dashboard port on 127.0.0.1) and
``dask worker`` processes, started when the test says, so workers join the
scheduler seconds after the scaler test server reports their pods. Its
:meth:`RealDask.registered` asks the scheduler itself (over its comm
protocol, not the HTTP route the code under test reads).
"""
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

from tests.dask_support import scheduler_workers
from tests.servers.scaler_server import DEFAULT_API_KEY
from tests.port_support import free_port

SCALER_VARIABLES = ("DOMINO_API_PROXY", "DOMINO_TOKEN", "DOMINO_RUN_ID", "DOMINO_API_HOST",
                    "DDLSCALE_BACKEND", "DDLSCALE_FRAMEWORK_READINESS", "DDLSCALE_FRAMEWORK_URL",
                    "DDLSCALE_DASK_URL", "DDLSCALE_RAY_URL", "DDLSCALE_SPARK_URL",
                    "DASK_SCHEDULER_SERVICE_HOST", "DASK_SCHEDULER_SERVICE_PORT",
                    "RAY_HEAD_SERVICE_HOST", "RAY_HEAD_SERVICE_PORT", "SPARK_MASTER", "SPARK_CONF_DIR",
                    "SPARK_HOME", "DDLSCALE_DASK_DASHBOARD_PORT", "DDLSCALE_RAY_DASHBOARD_PORT",
                    "DDLSCALE_SPARK_WEBUI_PORT", "SPARK_MASTER_WEBUI_PORT")


def use_scaler(monkeypatch, server, state_dir: Path) -> None:
    """Select the scaler backend on ``server`` purely through the environment, as in a Domino run."""
    for name in SCALER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLUSTER_SCALER_BASE_URL", server.url)
    monkeypatch.setenv("DOMINO_API_KEY", DEFAULT_API_KEY)
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(state_dir))


class RealDask:
    """A real Dask scheduler (with its HTTP server) and workers started on request."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.dashboard_port = free_port()
        self.address: Optional[str] = None
        self._scheduler: Optional[subprocess.Popen] = None
        self._workers: List[subprocess.Popen] = []
        self._timers: List[threading.Timer] = []
        self._lock = threading.Lock()
        self._stopped = False

    def start(self) -> "RealDask":
        scheduler_file = self.workdir / "scheduler.json"
        self._scheduler = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", f"127.0.0.1:{self.dashboard_port}", "--scheduler-file", str(scheduler_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if scheduler_file.exists() and scheduler_file.stat().st_size:
                self.address = json.loads(scheduler_file.read_text())["address"]
                if scheduler_workers(self.address) is not None:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the Dask scheduler did not start within 60 s")

    def env(self) -> Dict[str, str]:
        """What Domino gives a run with a Dask cluster, plus the dashboard port of this scheduler."""
        assert self.address is not None
        return {
            "DASK_SCHEDULER_SERVICE_HOST": "127.0.0.1",
            "DASK_SCHEDULER_SERVICE_PORT": self.address.rsplit(":", 1)[1],
            "DDLSCALE_DASK_DASHBOARD_PORT": str(self.dashboard_port),
        }

    def add_worker(self, after: float = 0.0) -> None:
        """Start one worker process ``after`` seconds from now; it joins once it has started."""
        timer = threading.Timer(after, self._spawn)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _spawn(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._workers.append(self._popen_worker())

    def _popen_worker(self) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", str(self.address), "--no-nanny",
             "--no-dashboard", "--nthreads", "1", "--host", "127.0.0.1", "--death-timeout", "30",
             "--local-directory", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def stop_workers(self) -> None:
        """Stop every worker process, as their pods going away would."""
        with self._lock:
            workers, self._workers = list(self._workers), []
        for proc in workers:
            proc.terminate()
        for proc in workers:
            proc.wait(timeout=15)

    def registered(self) -> int:
        """Workers the scheduler itself lists now."""
        assert self.address is not None
        workers = scheduler_workers(self.address)
        return -1 if workers is None else len(workers)

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        with self._lock:
            self._stopped = True
            workers = list(self._workers)
        # Workers first, while their scheduler still answers: a worker whose scheduler went first
        # spends its whole close timeout trying to say goodbye.
        _terminate(workers)
        _terminate([self._scheduler] if self._scheduler else [])

    def __enter__(self) -> "RealDask":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate(procs: List[subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM to each of ``procs``, then SIGKILL to those still running ``grace`` seconds later."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
