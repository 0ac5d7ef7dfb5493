"""The Ray driver of the local backend: a ``ray start --head`` node and ``ray start`` worker nodes.

Each node is one ``ray start --block`` process; its raylet, object store,
agents (and, on the head, the GCS, dashboard and client server) are its
children in its process group and stop with it. A tier's ``cores`` become
the node's ``--num-cpus`` and its ``memory`` the node's memory (object
store plus ``--memory``). Workers are named (``--node-name``) after their
worker record, so the head's node list tells which have joined.

Ray has no call that drains and removes a node from outside other than
stopping it: SIGTERM to ``ray start --block`` marks the node draining (no
new tasks), waits for its running tasks up to
``$RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` (Ray's default 30 s; the
supervisor's stop grace bounds it) and stops its processes. Objects whose
only copy lived on the node are lost, as on Domino when a pod goes.

Every node listens on loopback only and runs with Ray's token
authentication; the token lives in the cluster's folder (mode 0600), is new
at each head start, is sent only to a port proven to be this user's, and
:meth:`RayDriver.connection_env` hands user code its path (see
:mod:`.ray_ops`). Every gRPC channel of the cluster (between its processes,
and a ``ray://`` client's) runs Ray's mutual TLS with the cluster's own
authority (:func:`~.ray_ops.tls_env`), so a call, and the token in it, goes
only to a process holding the cluster's certificate: not to another user
who took a port after the cluster's process there died.
"""
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from .._support.privatefs import check_private_dir
from . import _ray_ops as ray_ops
from ._dask_tls import DaskTls, ensure_tls
from ._env import ray_env
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
TLS_DIR = "tls_dir"
"""``record.framework`` key: the cluster's folder of TLS files (its authority, certificate and key), which
every node and client of a head that recorded it uses for Ray's mutual TLS (:func:`~.ray_ops.tls_env`)."""


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
        return ray_ops.head_argv(
            self.python, record.host, record.port, record.ports[DASHBOARD], record.ports[CLIENT],
            ray_ops.ray_temp_dir(folder), token, tls,
        )

    def worker_argv(self, record: ClusterRecord, name: str, shape: WorkerShape, workdir: Path) -> List[str]:
        return ray_ops.worker_argv(
            self.python, self.address(record), str(workdir.parent / ray_ops.HEAD_READY_FILE), record.host, name,
            shape.nthreads, shape.memory_limit, ray_ops.ray_temp_dir(record.framework[TEMP_DIR]),
            record.framework.get(TOKEN_PATH) or str(workdir.parent / ray_ops.TOKEN_FILE), _tls_of(record),
            (record.scheduler.pid, record.scheduler.start) if record.scheduler is not None else None,
        )

    def registered_workers(self, record: ClusterRecord) -> Optional[Set[str]]:
        if not record.ports.get(DASHBOARD) or not record.framework.get(TOKEN_PATH):
            return None
        return ray_ops.alive_worker_nodes(self._dashboard(record), record.framework[TOKEN_PATH])

    def head_ready(self, record: ClusterRecord) -> bool:
        """The dashboard lists the head node ALIVE and the client server accepts connections: on a
        loaded machine a head node can register after its client server (which waits 30 s for it, then
        exits and takes the whole head down) gave up.

        Worker nodes are told earlier (:data:`~.ray_ops.HEAD_READY_FILE`, beside the token), once the
        dashboard lists the head node ALIVE: they join the GCS, not the client server, and by hand
        ``ray start --address`` runs then too (the client server took ~1 s more, measured). The
        listing comes through the read that proves the dashboard this user's, so the file still
        follows that proof."""
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
        """Domino's variables, plus token authentication and the path of the cluster's token file
        (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN_PATH``), which ``ray.init("ray://...")`` and the
        framework check read, and Ray's TLS with the cluster's files (``RAY_USE_TLS``, ``RAY_TLS_*``),
        without which ``ray.init("ray://...")`` cannot reach the client server."""
        env = ray_env(record.host, record.ports.get(CLIENT, 0), record.ports.get(DASHBOARD, 0))
        if record.framework.get(TOKEN_PATH):
            env.update(ray_ops.client_env(record.framework[TOKEN_PATH], _tls_of(record)))
        return env

    def details(self, record: ClusterRecord, store: LocalStateStore) -> Dict[str, Any]:
        folder = self._temp_dir(record, store)
        tls = _tls_of(record)
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


def _tls_of(record: ClusterRecord) -> Optional[DaskTls]:
    """The TLS files of ``record``'s cluster (its recorded ``tls_dir``, checked when the record was read), or
    None for a head started before local Ray clusters spoke TLS."""
    folder = record.framework.get(TLS_DIR)
    return DaskTls.of(Path(folder).parent) if folder else None
