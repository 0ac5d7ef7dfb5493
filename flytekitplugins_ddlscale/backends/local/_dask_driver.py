"""The Dask driver of the local backend: a ``dask scheduler`` head and ``dask worker`` processes.

Every process and client speaks ``tls://`` with the cluster's certificate (:mod:`._secrets`), made at the
first head start; the record keeps its folder (``framework.tls_dir``). Readiness and registered workers come
from the file the scheduler's preload keeps (:mod:`._dask_watch`). A cluster recorded by a version without
either does not answer: ``ddlscale local down`` and ``up`` start it again.
"""
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from ..._core import settings
from ...errors import BackendUnavailableError
from . import _dask_ops as dask_ops
from ._secrets import TLS_DIR, DaskTls, ensure_tls, tls_of
from ._driver import dask_env
from ._state import ClusterRecord, LocalStateStore
from ._tiers import WorkerShape


class DaskDriver:
    """Local Dask clusters: see :class:`~.driver.FrameworkDriver` for what each method promises."""

    kind = "dask"
    framework = "Dask"
    head_label = "Dask scheduler"
    head_ports: Tuple[str, ...] = ()
    workers_exit_with_head = True

    def address(self, record: ClusterRecord) -> str:
        """``tls://host:port``: the only scheme the scheduler takes."""
        return record.address

    def head_argv(self, record: ClusterRecord, store: LocalStateStore) -> List[str]:
        tls = ensure_tls(store.cluster_dir(record.ref))
        record.framework[TLS_DIR] = str(tls.ca_file.parent)
        scratch = str(store.private_cluster_dir(record.ref, "work"))
        return dask_ops.scheduler_argv(record.host, record.port, str(store.scheduler_file(record.ref)), tls, scratch)

    def worker_argv(self, record: ClusterRecord, name: str, shape: WorkerShape, workdir: Path) -> List[str]:
        return dask_ops.worker_argv(self.address(record), name, shape, str(workdir), record.host,
                                    DaskTls.of(workdir.parent))

    def registered_workers(self, record: ClusterRecord) -> Optional[Set[str]]:
        """What the scheduler's preload lists in the cluster's folder (:func:`~.dask_ops.listed_workers`),
        while the scheduler answers on its HTTP server (:func:`~.dask_ops.scheduler_answers`): one local
        request, no ``distributed`` imported. None while it does not answer."""
        folder = record.framework.get(TLS_DIR)
        if not folder or record.scheduler is None:
            return None  # recorded by a version without TLS, or no scheduler: it does not answer
        listed = dask_ops.listed_workers(Path(folder).parent, record.scheduler)
        if listed is None or not dask_ops.scheduler_answers(self.address(record), record.host, listed.http_port):
            return None
        return listed.names

    def head_ready(self, record: ClusterRecord) -> bool:
        # The preload writes the file once the scheduler listens: Dask starts preloads after its listeners.
        return self.registered_workers(record) is not None

    def retire_workers(self, record: ClusterRecord, names: List[str], timeout: float) -> bool:
        tls = tls_of(record.framework)
        if tls is None:
            raise BackendUnavailableError(f"{record.ref} has no TLS files recorded; its scheduler cannot be asked")
        dask_ops.retire_workers(self.address(record), tls, names, timeout)
        return True

    def connection_env(self, record: ClusterRecord) -> Dict[str, str]:
        """Domino's ``DASK_SCHEDULER_SERVICE_HOST``/``_PORT``, plus what a client needs to pass the
        cluster's TLS: Dask's settings naming the cluster's certificate files, with ``tls`` as the
        default scheme (so ``Client(f"{host}:{port}")`` connects), and ``$DASK_SCHEDULER_ADDRESS``
        (``Client()`` alone connects)."""
        tls = tls_of(record.framework)
        return {
            **dask_env(record.host, record.port),
            settings.DASK_SCHEDULER_ADDRESS.name: self.address(record),
            **(tls.client_config() if tls is not None else {}),
        }

    def outside_paths(self, record: ClusterRecord, store: LocalStateStore) -> List[Path]:
        return []

    def details(self, record: ClusterRecord, store: LocalStateStore) -> Dict[str, Any]:
        tls = DaskTls.of(store.cluster_dir(record.ref))
        return {
            "scheduler_file": str(store.scheduler_file(record.ref)),
            "tls_ca_file": str(tls.ca_file), "tls_cert": str(tls.cert), "tls_key": str(tls.key),
        }
