"""What the local backend needs from one framework (:class:`FrameworkDriver`), which driver runs which kind
(:func:`load_driver`), and the connection variables Domino injects, which a driver sets for its head.

A local cluster is one head process plus one process per worker, spawned detached by the
:class:`~._supervisor.ProcessSupervisor` from the command lines a driver gives and recorded by pid and start
time. The supervisor owns the processes, the backend the protocol; a driver only knows its framework. A
driver is imported when a cluster of its kind is first used (a laptop with only Dask never imports Ray or
Spark code); one whose framework is not installed says, on construction, what to install.
"""
import importlib
import sys
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Protocol, Set, Tuple, runtime_checkable

from ..._core import settings
from ...errors import UnsupportedOperationError
from ._state import ClusterRecord, LocalStateStore
from ._tiers import WorkerShape

DASK_HOST_ENV = settings.DASK_SCHEDULER_SERVICE_HOST.name
DASK_PORT_ENV = settings.DASK_SCHEDULER_SERVICE_PORT.name
RAY_HOST_ENV = settings.RAY_HEAD_SERVICE_HOST.name
RAY_PORT_ENV = settings.RAY_HEAD_SERVICE_PORT.name
RAY_DASHBOARD_PORT_ENV = settings.RAY_DASHBOARD_PORT.name


def dask_env(host: str, port: int) -> Dict[str, str]:
    """The Domino variables naming a Dask scheduler at ``host:port``: code written for Domino connects unchanged."""
    return {DASK_HOST_ENV: host, DASK_PORT_ENV: str(port)}


def ray_env(host: str, client_port: int, dashboard_port: int) -> Dict[str, str]:
    """The Domino variables naming a Ray head at ``host`` (``ray.init(f"ray://{host}:{port}")`` with the client
    server's port), plus ``$DDLSCALE_RAY_DASHBOARD_PORT``: the framework check finds the head from the host and
    that port (a local dashboard is not on Domino's 8265)."""
    return {RAY_HOST_ENV: host, RAY_PORT_ENV: str(client_port), RAY_DASHBOARD_PORT_ENV: str(dashboard_port)}


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


_DRIVERS: Dict[str, str] = {
    "dask": "flytekitplugins_ddlscale.backends.local._dask_driver:DaskDriver",
    "ray": "flytekitplugins_ddlscale.backends.local._ray_driver:RayDriver",
    "spark": "flytekitplugins_ddlscale.backends.local._spark_driver:SparkDriver",
}
"""Kind -> ``module:class`` of its driver."""

SERVED_KINDS: FrozenSet[str] = frozenset(_DRIVERS)
"""The cluster kinds the local backend runs."""

PLATFORM_KINDS: Dict[str, FrozenSet[str]] = {"linux": SERVED_KINDS, "darwin": frozenset({"dask", "spark"})}
"""The kinds the local backend runs on each platform it supports (by ``sys.platform``: Linux, macOS), reading
processes through ``psutil``. Ray is Linux's alone: its worker nodes die with their wrapper through ``prctl``,
and its token goes only to a listener ``/proc/net/tcp`` shows is this user's (``_core/peerowner.py``)."""


def check_platform(platform: str, kind: Optional[str] = None) -> None:
    """:class:`UnsupportedOperationError` (one line naming ``platform`` and what runs where) unless the local
    backend runs on ``platform`` (a ``sys.platform`` value), and runs clusters of ``kind`` there if given."""
    kinds = PLATFORM_KINDS.get(platform, frozenset())
    if not kinds or (kind is not None and kind not in kinds):
        runs = "; ".join(f"{name}: {', '.join(sorted(served))}" for name, served in PLATFORM_KINDS.items())
        what = f"{kind} clusters on" if kinds else "on"
        raise UnsupportedOperationError(f"the local backend does not run {what} {platform} (it runs {runs})")


def load_driver(kind: str) -> FrameworkDriver:
    """A new driver for local clusters of ``kind`` (one of :data:`SERVED_KINDS`), refused first on a
    platform that does not run it (:func:`check_platform`)."""
    check_platform(sys.platform, kind)
    module_name, class_name = _DRIVERS[kind].split(":")
    driver_class = getattr(importlib.import_module(module_name), class_name)
    driver: FrameworkDriver = driver_class()
    return driver


def served_frameworks() -> str:
    """The served kinds as a message names them: ``dask, ray and spark``."""
    kinds = sorted(SERVED_KINDS)
    return kinds[0] if len(kinds) == 1 else f"{', '.join(kinds[:-1])} and {kinds[-1]}"
