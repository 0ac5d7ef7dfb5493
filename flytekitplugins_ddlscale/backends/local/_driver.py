"""What the local backend needs from one framework: the driver interface.

A local cluster is one head process plus one process per worker, spawned
detached by the :class:`~.supervisor.ProcessSupervisor` from the command
lines a driver gives and recorded by pid and start time. The supervisor
owns everything about processes (spawn, stop, liveness, ports, log tails,
repair, the cluster lock) and the backend owns the protocol; a driver
(:class:`FrameworkDriver`) only knows its framework. Which driver runs which
kind is :mod:`.drivers`' registry.

A head restart stops every process and starts the head and the same-named
workers again, so a driver needs nothing more for it.
"""
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Set, Tuple, runtime_checkable

from ._state import ClusterRecord, LocalStateStore
from ._tiers import WorkerShape


class FrameworkDriver(Protocol):
    """One framework's head and worker processes, as the local backend starts and observes them.

    Both command-line methods may record what they chose (ports, file paths) in ``record.framework``
    and write files in the cluster's folder; the supervisor saves the record after each spawn, so
    later calls (in any process) find it there."""

    kind: str
    """The :class:`ClusterRef` kind it serves."""
    framework: str
    head_label: str
    """How messages name the framework and its head ("Dask", "Dask scheduler")."""
    head_ports: Tuple[str, ...]
    """Names of the head's ports besides its main one (Ray's dashboard and client server), chosen free
    by the supervisor and kept in ``record.ports`` across head restarts."""
    workers_exit_with_head: bool
    """Whether workers close cleanly when their head stops (Dask); where not (Ray workers wait a minute
    for a lost head, Spark workers keep trying to reach a lost master), the supervisor stops the workers
    before the head."""

    def address(self, record: ClusterRecord) -> str:
        """Where workers and clients reach the head of ``record``."""
        ...

    def head_argv(self, record: ClusterRecord, store: LocalStateStore) -> List[str]:
        """The command line of the head on ``record.host:record.port``; its files go in ``store``'s
        folder of the cluster."""
        ...

    def worker_argv(self, record: ClusterRecord, name: str, shape: WorkerShape, workdir: Path) -> List[str]:
        """The command line of one worker named ``name`` of ``shape`` (threads, memory) joining the head
        of ``record`` at :meth:`address`: it keeps trying while the head starts, and exits on its own once
        its head is gone for good."""
        ...

    def registered_workers(self, record: ClusterRecord) -> Optional[Set[str]]:
        """Names of the workers the head reports as registered (readiness is registration, not a live
        pid); None when the head does not answer."""
        ...

    def head_ready(self, record: ClusterRecord) -> bool:
        """Whether the head of ``record`` has finished starting: it answers, and every part of it that
        could still give up on its own is up (the supervisor waits for it before a start counts as done)."""
        ...

    def retire_workers(self, record: ClusterRecord, names: List[str], timeout: float) -> bool:
        """Ask the head to drain and close ``names`` within ``timeout``: True once asked (they exit on
        their own), False when stopping them is the drain (Ray: SIGTERM drains a node, so the supervisor
        signals at once); :class:`BackendUnavailableError` if not (the supervisor then terminates them)."""
        ...

    def connection_env(self, record: ClusterRecord) -> Dict[str, str]:
        """The variables Domino injects for this framework's head, for ``record``'s head, so code
        written for Domino connects unchanged."""
        ...

    def details(self, record: ClusterRecord, store: LocalStateStore) -> Dict[str, Any]:
        """Framework-specific entries of ``ddlscale local describe`` for ``record`` (JSON-ready: the Dask
        scheduler file, the Ray dashboard...)."""
        ...

    def outside_paths(self, record: ClusterRecord, store: LocalStateStore) -> List[Path]:
        """Folders of ``record`` outside ``store``'s folder of the cluster (Ray's temp folder), to remove
        with it."""
        ...


@runtime_checkable
class LosesLiveWorkers(Protocol):
    """A driver whose head can give up on a worker whose process still runs (a Spark worker the master
    shows DECOMMISSIONED: it gets no work again and does not exit on its own), so that repair replaces it."""

    def finished_workers(self, record: ClusterRecord) -> Set[str]:
        """Names of ``record``'s workers the head has given up on for good (empty when it does not answer)."""
        ...
