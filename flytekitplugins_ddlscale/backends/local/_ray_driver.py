"""The Ray driver of the local backend: a ``ray start --head`` node and ``ray start`` worker nodes.

Each node is one ``ray start --block`` process group; a tier's ``cores`` and ``memory`` become its CPUs and
memory, workers are named after their records (the head's node list tells which joined), and a node is
drained by SIGTERM. Loopback, token and TLS: :mod:`._ray_ops`.
"""
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from .._support.privatefs import check_private_dir
from . import _ray_ops as ray_ops
from ._secrets import TLS_DIR, ensure_tls, tls_of
from ._driver import ray_env
from ._state import ClusterRecord, LocalStateStore
from ._tiers import WorkerShape

DASHBOARD = "dashboard"
CLIENT = "client"
TEMP_DIR = "temp_dir"
"""``record.framework`` key: the cluster's private folder of Ray files, holding the head's ``--temp-dir``
(worker nodes have theirs inside that); recorded because it may be a ``mkdtemp`` folder
(:func:`~.ray_ops.temp_dir`)."""
TOKEN_PATH = "auth_token_path"
"""``record.framework`` key: the file holding the cluster's Ray authentication token."""


class RayDriver:
    """Local Ray clusters: see :class:`~.driver.FrameworkDriver` for what each method promises.

    Construction finds the ``ray`` command (:func:`~.ray_ops.ray_executable`)
    and its Python (:func:`~.ray_ops.ray_python`), and raises
    :class:`UnsupportedOperationError` saying how to install Ray when there is none.
    """

    kind = "ray"
    framework = "Ray"
    head_label = "Ray head"
    head_ports: Tuple[str, ...] = (DASHBOARD, CLIENT)
    workers_exit_with_head = False

    def __init__(self) -> None:
        self.ray = ray_ops.ray_executable()
        self.python = ray_ops.ray_python(self.ray)

    def address(self, record: ClusterRecord) -> str:
        """The GCS address ``ray start --address`` joins (clients use :meth:`connection_env`)."""
        return f"{record.host}:{record.port}"

    def head_argv(self, record: ClusterRecord, store: LocalStateStore) -> List[str]:
        folder = record.framework[TEMP_DIR] = self._temp_dir(record, store, create=True)
        cluster_dir = store.cluster_dir(record.ref)
        ray_ops.head_starting(cluster_dir)
        token = record.framework[TOKEN_PATH] = str(ray_ops.new_token(cluster_dir / ray_ops.TOKEN_FILE))
        # The cluster's authority and certificate are made once and kept for its life (as Dask's).
        tls = ensure_tls(cluster_dir)
        record.framework[TLS_DIR] = str(tls.ca_file.parent)
        nodes = ray_ops.RayNodes(self.python, record.host, record.port, ray_ops.ray_temp_dir(folder), token, tls)
        return ray_ops.head_argv(nodes, record.ports[DASHBOARD], record.ports[CLIENT])

    def worker_argv(self, record: ClusterRecord, name: str, shape: WorkerShape, workdir: Path) -> List[str]:
        nodes = ray_ops.RayNodes(
            self.python, record.host, record.port, ray_ops.ray_temp_dir(record.framework[TEMP_DIR]),
            record.framework.get(TOKEN_PATH) or str(workdir.parent / ray_ops.TOKEN_FILE), tls_of(record.framework),
        )
        head = (record.scheduler.pid, record.scheduler.start) if record.scheduler is not None else None
        return ray_ops.worker_argv(nodes, name, shape, str(workdir.parent / ray_ops.HEAD_READY_FILE), head)

    def registered_workers(self, record: ClusterRecord) -> Optional[Set[str]]:
        if not record.ports.get(DASHBOARD) or not record.framework.get(TOKEN_PATH):
            return None
        return ray_ops.alive_worker_nodes(self._dashboard(record), record.framework[TOKEN_PATH])

    def head_ready(self, record: ClusterRecord) -> bool:
        """The dashboard (proven this user's) lists the head node ALIVE, which tells the worker nodes
        (:data:`~._ray_ops.HEAD_READY_FILE`: they join the GCS), and the client server accepts connections:
        on a loaded machine it can give up on a head node that registers late and take the head down."""
        if not record.ports.get(DASHBOARD) or not record.framework.get(TOKEN_PATH):
            return False
        nodes = ray_ops.alive_nodes(self._dashboard(record), record.framework[TOKEN_PATH])
        if not nodes or not any(node.get("is_head_node") for node in nodes):
            return False
        ray_ops.mark_head_ready(Path(record.framework[TOKEN_PATH]).parent)
        return ray_ops.accepts_connections(record.host, record.ports.get(CLIENT, 0))

    def retire_workers(self, record: ClusterRecord, names: List[str], timeout: float) -> bool:
        # Stopping a Ray node is its drain (see the module docstring): nothing to ask the head first.
        return False

    def connection_env(self, record: ClusterRecord) -> Dict[str, str]:
        """Domino's variables, plus token authentication with the token file's path (never the token) and
        Ray's TLS with the cluster's files, without which ``ray.init("ray://...")`` cannot connect."""
        env = ray_env(record.host, record.ports.get(CLIENT, 0), record.ports.get(DASHBOARD, 0))
        if record.framework.get(TOKEN_PATH):
            env.update(ray_ops.client_env(record.framework[TOKEN_PATH], tls_of(record.framework)))
        return env

    def details(self, record: ClusterRecord, store: LocalStateStore) -> Dict[str, Any]:
        folder = self._temp_dir(record, store)
        tls = tls_of(record.framework)
        return {
            "dashboard": self._dashboard(record),
            "client_address": f"ray://{record.host}:{record.ports.get(CLIENT, 0)}",
            "ray_temp_dir": ray_ops.ray_temp_dir(folder) if folder else None,
            **({"tls_ca_file": str(tls.ca_file), "tls_cert": str(tls.cert), "tls_key": str(tls.key)} if tls else {}),
        }

    def outside_paths(self, record: ClusterRecord, store: LocalStateStore) -> List[Path]:
        temp = self._temp_dir(record, store)
        return [Path(temp)] if temp and Path(temp).parent != store.cluster_dir(record.ref) else []

    @staticmethod
    def _temp_dir(record: ClusterRecord, store: LocalStateStore, create: bool = False) -> Optional[str]:
        """The cluster's recorded private folder of Ray files (its path checked when the record was
        read); with ``create``, a new one (:func:`~.ray_ops.temp_dir`) when none is recorded or the
        recorded one is gone."""
        temp = record.framework.get(TEMP_DIR)
        if temp and os.path.lexists(temp):
            check_private_dir(temp)
            return str(temp)
        if not create:
            return str(temp) if temp else None
        return ray_ops.temp_dir(store.cluster_dir(record.ref))

    def _dashboard(self, record: ClusterRecord) -> str:
        return ray_ops.dashboard_url(record.host, record.ports.get(DASHBOARD, 0))
