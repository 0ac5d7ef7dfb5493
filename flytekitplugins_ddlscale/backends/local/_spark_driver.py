"""The Spark driver of the local backend: a standalone master and worker processes from pyspark.

The cluster's ``conf/spark-defaults.conf`` names the master (:meth:`SparkDriver.connection_env` points
``SPARK_CONF_DIR`` at it, so ``SparkSession.builder.getOrCreate()`` connects unchanged); every process
shares a per-cluster secret from a 0600 file; a retired worker is decommissioned (SIGPWR), then ended
(:meth:`SparkDriver.finished_workers`). docs/local.md, Spark.
"""
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from ..._core import settings
from ...errors import BackendUnavailableError
from ..._core.waiting import Backoff, Deadline, poll
from ..._core.progress import seconds
from . import _procs as procs, _spark_ops as spark_ops
from .._support.privatefs import private_dir
from ._secrets import kept_secret
from ._state import ClusterRecord, LocalStateStore
from ._supervisor import free_port
from ._tiers import WorkerShape

SCRATCH = "scratch"
"""The sub-folder of the cluster's private ``work`` folder that holds Spark's scratch space."""
_RETIRE_POLL = Backoff(initial=0.1, factor=1.5, cap=0.5)
_STATES = {"ALIVE", "DEAD", "DECOMMISSIONED", "UNKNOWN"}
"""The states the master shows a worker in."""


class SparkDriver:
    """Local Spark standalone clusters: see :class:`~.driver.FrameworkDriver` for what each method promises.

    Constructing it checks that pyspark and Java 17+ are installed, raising
    :class:`UnsupportedOperationError` that says what to install otherwise.
    """

    kind = "spark"
    framework = "Spark"
    head_label = "Spark master"
    head_ports = ("webui",)
    workers_exit_with_head = False

    def __init__(self) -> None:
        self.home = spark_ops.spark_home()
        spark_ops.java_command()

    def address(self, record: ClusterRecord) -> str:
        return f"spark://{record.host}:{record.port}"

    def head_argv(self, record: ClusterRecord, store: LocalStateStore) -> List[str]:
        facts = record.framework
        folder = store.cluster_dir(record.ref)
        facts.update(
            python=sys.executable,
            conf_dir=str(folder / "conf"),
            daemon_conf=str(folder / "spark-daemon.conf"),
        )
        secret = kept_secret(folder / spark_ops.SECRET_FILE)
        spark_ops.write_properties(Path(facts["daemon_conf"]), spark_ops.daemon_properties(secret))
        # Spark's default executor memory until a worker's tier says otherwise.
        self._write_app_defaults(record, int(facts.get("executor_memory_mib") or 1024))
        return spark_ops.master_argv(self._daemons(record))

    def worker_argv(self, record: ClusterRecord, name: str, shape: WorkerShape, workdir: Path) -> List[str]:
        facts = record.framework
        live = {w.name for w in record.workers}
        workers = {n: p for n, p in facts.get("workers", {}).items() if n in live}
        taken = {record.port, *record.ports.values(), *(p for w in workers.values() for p in w.values()),
                 *self._listed_ports(record)}
        port = free_port(record.host, taken)
        workers[name] = {"port": port, "webui_port": free_port(record.host, taken | {port})}
        facts["workers"] = workers
        memory = max(1, shape.memory_limit // 2**20)
        facts["executor_memory_mib"] = memory
        # Executors must fit one worker of the tier the cluster is moving to.
        self._write_app_defaults(record, memory)
        return spark_ops.worker_argv(self._daemons(record), workers[name]["port"], workers[name]["webui_port"],
                                     shape.nthreads, memory, workdir / name)

    def registered_workers(self, record: ClusterRecord) -> Optional[Set[str]]:
        payload = spark_ops.master_json(self._webui(record))
        if payload is None:
            return None
        alive = spark_ops.workers_in(payload, {"ALIVE"})
        return {name for name, port in self._ports(record).items() if f"{record.host}:{port}" in alive}

    def finished_workers(self, record: ClusterRecord) -> Set[str]:
        """Workers of ``record`` the master shows DECOMMISSIONED (and not ALIVE): they get no executors
        again and do not exit on their own (a worker given SIGPWR outside a retirement)."""
        payload = spark_ops.master_json(self._webui(record))
        if payload is None:
            return set()
        finished = set(spark_ops.workers_in(payload, {"DECOMMISSIONED"})) - set(spark_ops.workers_in(payload, {"ALIVE"}))
        ports = self._ports(record)
        return {w.name for w in record.workers if w.name in ports and f"{record.host}:{ports[w.name]}" in finished}

    def head_ready(self, record: ClusterRecord) -> bool:
        return spark_ops.master_json(self._webui(record)) is not None

    def retire_workers(self, record: ClusterRecord, names: List[str], timeout: float) -> bool:
        """Decommission ``names`` (SIGPWR), wait until the master shows each decommissioned with
        no executor cores in use, then terminate them: True, they are on their way out."""
        ports = self._ports(record)
        leaving = [w for w in record.workers if w.name in names and procs.is_alive(w.proc)]
        endpoints = {f"{record.host}:{ports[w.name]}" for w in leaving if w.name in ports}
        for worker in leaving:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.proc.pid, signal.SIGPWR)
        deadline = Deadline(timeout)

        def busy() -> Optional[Set[str]]:
            """Those of ``endpoints`` the master shows alive or with executor cores in use (None: no answer)."""
            payload = spark_ops.master_json(self._webui(record), timeout=max(0.2, min(3.0, deadline.remaining)))
            if payload is None:
                return None
            return endpoints & {
                key for key, w in spark_ops.workers_in(payload, {"ALIVE", "DECOMMISSIONED"}).items()
                if w.get("state") == "ALIVE" or w.get("coresused", 0)
            }

        def timed_out(still: Optional[Set[str]]) -> BackendUnavailableError:
            return BackendUnavailableError(
                f"the Spark master at {self._webui(record)} did not show workers "
                f"{sorted(endpoints if still is None else still)} decommissioned with their executors gone "
                f"within {seconds(timeout)}"
            )

        poll(busy, lambda still: still == set(), deadline=deadline, schedule=_RETIRE_POLL, timed_out=timed_out)
        for worker in leaving:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.proc.pid, signal.SIGTERM)
        return True

    def connection_env(self, record: ClusterRecord) -> Dict[str, str]:
        """``SPARK_CONF_DIR`` (its ``spark-defaults.conf`` sets ``spark.master``, as on Domino), ``PYSPARK_PYTHON``
        (the Python with pyspark, which executors of an application started from Python use),
        ``SPARK_LOCAL_IP`` (a driver's web UI binds to loopback) and the master's web UI port."""
        return {
            settings.SPARK_CONF_DIR.name: str(record.framework.get("conf_dir", "")),
            settings.PYSPARK_PYTHON.name: str(record.framework.get("python", "")),
            settings.SPARK_LOCAL_IP.name: record.host,
            settings.SPARK_WEBUI_PORT.name: str(record.ports.get("webui", "")),
        }

    def outside_paths(self, record: ClusterRecord, store: LocalStateStore) -> List[Path]:
        return []

    def details(self, record: ClusterRecord, store: LocalStateStore) -> Dict[str, Any]:
        conf_dir = record.framework.get("conf_dir")
        return {
            "master_url": self.address(record),
            "webui_url": self._webui(record),
            "spark_defaults": str(Path(conf_dir) / "spark-defaults.conf") if conf_dir else None,
            "spark_home": str(self.home),
        }

    # ------------------------------------------------------------ internals

    def _daemons(self, record: ClusterRecord) -> spark_ops.SparkCluster:
        facts = record.framework
        return spark_ops.SparkCluster(self.home, Path(facts["conf_dir"]), Path(facts["daemon_conf"]), record.host,
                                      record.port, record.ports["webui"], self._scratch(record))

    def _webui(self, record: ClusterRecord) -> str:
        return f"http://{record.host}:{record.ports.get('webui', 0)}"

    def _listed_ports(self, record: ClusterRecord) -> Set[int]:
        """The ports of every worker the running master lists, in any state: a new worker never takes the
        port of one it still shows (a decommissioned worker's entry would stand for the new one)."""
        payload = spark_ops.master_json(self._webui(record), timeout=1.0) if record.ports.get("webui") else None
        return {int(key.rsplit(":", 1)[1]) for key in spark_ops.workers_in(payload or {}, _STATES) if key[-1:].isdigit()}

    @staticmethod
    def _ports(record: ClusterRecord) -> Dict[str, int]:
        return {str(n): int(w["port"]) for n, w in record.framework.get("workers", {}).items()}

    @staticmethod
    def _scratch(record: ClusterRecord) -> Path:
        """The cluster's private scratch folder (created 0700 if absent): Spark's local dirs and the
        temporary files of every process of the cluster and of its applications' drivers."""
        return private_dir(Path(record.framework["daemon_conf"]).parent / "work" / SCRATCH)

    def _write_app_defaults(self, record: ClusterRecord, executor_memory_mib: int) -> None:
        secret = kept_secret(Path(record.framework["daemon_conf"]).parent / spark_ops.SECRET_FILE)
        spark_ops.write_properties(
            Path(record.framework["conf_dir"]) / "spark-defaults.conf",
            spark_ops.app_properties(
                self.address(record), record.host, executor_memory_mib, record.framework["python"], secret,
                self._scratch(record),
            ),
        )

