"""The Dask driver of the local backend: a ``dask scheduler`` head and ``dask worker`` processes."""
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from . import _dask_ops as dask_ops
from ._env import dask_env
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
        return record.address

    def head_argv(self, record: ClusterRecord, store: LocalStateStore) -> List[str]:
        return dask_ops.scheduler_argv(record.host, record.port, str(store.scheduler_file(record.ref)))

    def worker_argv(self, record: ClusterRecord, name: str, shape: WorkerShape, workdir: Path) -> List[str]:
        return dask_ops.worker_argv(
            record.address, name, shape.nthreads, shape.memory_limit, str(workdir), record.host
        )

    def registered_workers(self, record: ClusterRecord) -> Optional[Set[str]]:
        seen = dask_ops.scheduler_workers(record.address)
        return None if seen is None else set(seen)

    def head_ready(self, record: ClusterRecord) -> bool:
        return self.registered_workers(record) is not None

    def retire_workers(self, record: ClusterRecord, names: List[str], timeout: float) -> bool:
        dask_ops.retire_workers(record.address, names, timeout)
        return True

    def connection_env(self, record: ClusterRecord) -> Dict[str, str]:
        return dask_env(record.host, record.port)

    def outside_paths(self, record: ClusterRecord, store: LocalStateStore) -> List[Path]:
        return []

    def details(self, record: ClusterRecord, store: LocalStateStore) -> Dict[str, Any]:
        return {"scheduler_file": str(store.scheduler_file(record.ref))}
