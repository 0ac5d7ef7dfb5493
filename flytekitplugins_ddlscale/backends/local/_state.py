"""The state directory (``$DDLSCALE_STATE_DIR/local`` by default): one folder per local cluster, shared by
every process::

    clusters/<namespace>.<kind>.<name>/cluster.json   processes, port, tiers, desired size
    clusters/<namespace>.<kind>.<name>/cluster.lock   fcntl lock held for every change
    clusters/<namespace>.<kind>.<name>/scheduler.json Dask scheduler file (Client(scheduler_file=...))
    clusters/<namespace>.<kind>.<name>/logs/          scheduler and worker logs
    clusters/<namespace>.<kind>.<name>/conf/          Spark: spark-defaults.conf for user code
    records/                                          baselines and claims (FileRecordStore)

``cluster.json`` is replaced atomically (readers need no lock), holds a change's intent (``pending``) until
the record is whole again, and is checked with the rules of user input when read (:mod:`._record_check`).
Every folder is private (0700; a link, another user's or one others can write is refused), and no file is
opened through a link.
"""
import contextlib
import datetime
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union

from ...errors import ConflictError, InvalidInputError, ScalingError, UnsafePathError
from .._support.filestore import default_state_dir
from .._support.lockfile import exclusive, remove_unused
from ..._core.leases import holder_gone, this_holder
from .._support.privatefs import check_private_dir, private_dir, read_record_text, remove_nofollow
from ..._core.records import json_object, reading
from ...refs import ClusterRef
from .._support.privatefs import write_json, writing
from ..._core.progress import seconds
from ._procs import CLUSTER_MARK_ENV, Mark, ProcessId, is_alive
from ._record_check import check_cluster_json

CLUSTER_FILE = "cluster.json"
LOCK_FILE = "cluster.lock"
logger = logging.getLogger("flytekitplugins_ddlscale.local")


def default_local_state_dir() -> Path:
    """``$DDLSCALE_STATE_DIR/local``, else ``~/.ddlscale/local``."""
    return default_state_dir() / "local"


@dataclass
class WorkerRecord:
    """One worker process and the tier it was started with."""

    name: str
    """The worker's name as the scheduler knows it."""
    proc: ProcessId
    tier: str
    nthreads: int
    memory_limit: int
    """Bytes."""

    def to_json(self) -> Dict[str, Any]:
        """The fields stored in the state file."""
        return {
            "name": self.name,
            **self.proc.to_json(),
            "tier": self.tier,
            "nthreads": self.nthreads,
            "memory_limit": self.memory_limit,
        }

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "WorkerRecord":
        """A record from :meth:`to_json` output."""
        return cls(
            data["name"],
            ProcessId(int(data["pid"]), int(data["start"])),
            data["tier"],
            int(data["nthreads"]),
            int(data["memory_limit"]),
        )


@dataclass
class PendingChange:
    """A change under way: recorded before its first process is started or stopped, cleared once the
    record holds every process again. Found under the cluster's lock, it was interrupted."""

    desired: int
    """The size the change was bringing the cluster to."""
    holder: str = field(default_factory=this_holder)
    """``host:pid`` of the process making the change."""
    since: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat())

    def to_json(self) -> Dict[str, Any]:
        """The fields stored in the state file."""
        return {"desired": self.desired, "holder": self.holder, "since": self.since}

    def interrupted(self) -> bool:
        """Whether the process making the change is gone (so it will never finish it)."""
        return holder_gone(self.holder)


@dataclass
class ClusterRecord:
    """Everything the state directory knows about one local cluster."""

    ref: ClusterRef
    host: str
    port: int = 0
    """Scheduler port; 0 until the first scheduler has chosen one."""
    ports: Dict[str, int] = field(default_factory=dict)
    """The head's other ports by name (a driver's ``head_ports``), kept across head restarts."""
    scheduler: Optional[ProcessId] = None
    head_hw_tier: Optional[str] = None
    worker_hw_tier: str = ""
    desired: int = 0
    workers: List[WorkerRecord] = field(default_factory=list)
    next_index: int = 0
    """Suffix of the next worker name, so a name is never reused within a cluster."""
    ephemeral: bool = True
    """Created implicitly by a scale; restoring its baseline removes it again."""
    framework: Dict[str, Any] = field(default_factory=dict)
    """What the framework's driver chose and must find again (JSON-ready): e.g. the Spark
    master's web UI port and each Spark worker's port; empty for Dask."""
    created_at: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat()
    )
    pending: Optional[PendingChange] = None
    """A change under way (or interrupted: see :class:`PendingChange`); None when the record is whole."""

    @property
    def address(self) -> str:
        """The Dask scheduler address workers and clients connect to (TLS only: :mod:`.secrets`)."""
        return f"tls://{self.host}:{self.port}"

    def to_json(self) -> Dict[str, Any]:
        """The document stored as ``cluster.json``."""
        return {
            "kind": self.ref.kind,
            "name": self.ref.name,
            "namespace": self.ref.namespace,
            "host": self.host,
            "port": self.port,
            "ports": dict(self.ports),
            "scheduler": self.scheduler.to_json() if self.scheduler else None,
            "head_hw_tier": self.head_hw_tier,
            "worker_hw_tier": self.worker_hw_tier,
            "desired": self.desired,
            "workers": [w.to_json() for w in self.workers],
            "next_index": self.next_index,
            "ephemeral": self.ephemeral,
            "framework": self.framework,
            "created_at": self.created_at,
            "pending": self.pending.to_json() if self.pending else None,
        }

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "ClusterRecord":
        """A record from :meth:`to_json` output."""
        sched = data.get("scheduler")
        return cls(
            ref=ClusterRef(data["kind"], data["name"], data.get("namespace")),
            host=data["host"],
            port=int(data["port"]),
            ports={str(k): int(v) for k, v in (data.get("ports") or {}).items()},
            scheduler=ProcessId(int(sched["pid"]), int(sched["start"])) if sched else None,
            head_hw_tier=data.get("head_hw_tier"),
            worker_hw_tier=data.get("worker_hw_tier") or "",
            desired=int(data.get("desired", 0)),
            workers=[WorkerRecord.from_json(w) for w in data.get("workers", [])],
            next_index=int(data.get("next_index", 0)),
            ephemeral=bool(data.get("ephemeral", True)),
            framework=dict(data.get("framework") or {}),
            created_at=data.get("created_at") or "",
            pending=PendingChange(**data["pending"]) if data.get("pending") else None,
        )


class LocalStateStore:
    """Reads and writes cluster records in a state directory."""

    def __init__(self, root: Union[str, Path, None] = None) -> None:
        if root is None:
            private_dir(default_state_dir())
        self.root = private_dir(root if root is not None else default_local_state_dir())
        self.clusters_dir = private_dir(self.root / "clusters")
        self.records_dir = self.root / "records"

    def cluster_dir(self, ref: ClusterRef) -> Path:
        """The folder of ``ref``'s files (its path only: :meth:`private_cluster_dir` creates and checks it)."""
        return self.clusters_dir / f"{ref.namespace or '_'}.{ref.kind}.{ref.name}"

    def private_cluster_dir(self, ref: ClusterRef, *parts: str) -> Path:
        """``ref``'s folder (or the sub-folder ``parts``), created 0700 if absent; :class:`UnsafePathError`
        when it is a link, another user's, or writable by others."""
        return private_dir(self.cluster_dir(ref).joinpath(*parts))

    def scheduler_file(self, ref: ClusterRef) -> Path:
        """The ``--scheduler-file`` of ``ref``'s scheduler, for ``Client(scheduler_file=...)``."""
        return self.cluster_dir(ref) / "scheduler.json"

    def log_path(self, ref: ClusterRef, process: str) -> Path:
        """Where the output of one process of ``ref`` goes."""
        return self.cluster_dir(ref) / "logs" / f"{process}.log"

    def load(self, ref: ClusterRef) -> Optional[ClusterRecord]:
        """The record of ``ref``, or None when there is none; :class:`CorruptRecordError` (naming the file, field
        and value) for one user input could not have made, :class:`UnsafePathError` for a path others could steer."""
        folder = self.cluster_dir(ref)
        if not os.path.lexists(folder):
            return None
        check_private_dir(folder)
        path = folder / CLUSTER_FILE
        remedy = (
            f"`ddlscale local down --kind {ref.kind} --name {ref.name}` stops every process of the cluster "
            f"(recorded or not) and removes the record"
        )
        with reading(str(path), remedy):
            try:
                text = read_record_text(path)
            except FileNotFoundError:
                return None
            except UnsafePathError as exc:  # a link, never followed
                raise InvalidInputError(CLUSTER_FILE, exc.reason, "a regular file, not a link") from None
            data = json_object(text, "cluster.json")
            check_cluster_json(data, folder)
            record = ClusterRecord.from_json(data)
            if record.ref != ref:
                raise InvalidInputError("kind/name/namespace", str(record.ref), f"{ref}, the cluster of its folder")
            _check_marked(record, Mark.of(folder))
        return record

    def record_path(self, ref: ClusterRef) -> Path:
        """``ref``'s ``cluster.json``."""
        return self.cluster_dir(ref) / CLUSTER_FILE

    def save(self, record: ClusterRecord) -> None:
        """Write ``record`` atomically (callers hold :meth:`lock`); :class:`StateWriteError` when the
        folder or the disk refuses it (no temp file is left)."""
        folder = self.private_cluster_dir(record.ref)
        write_json(folder / CLUSTER_FILE, record.to_json(), indent=1)

    def delete(self, ref: ClusterRef) -> None:
        """Remove every file of ``ref`` but its lock (callers hold :meth:`lock`, whose release removes the rest),
        never following a link; a folder that is a link or not this user's is refused (:class:`UnsafePathError`)."""
        folder = self.cluster_dir(ref)
        if not os.path.lexists(folder):
            return
        check_private_dir(folder)
        with os.scandir(folder) as entries:
            names = [entry.name for entry in entries if entry.name != LOCK_FILE]
        for name in names:
            with writing(folder / name):
                remove_nofollow(folder / name)

    def folders(self) -> List[ClusterRef]:
        """Every cluster that has a folder holding more than its lock (a record, readable or not, or
        files its processes wrote), sorted by name; folders that name no cluster are skipped."""
        found = []
        with os.scandir(self.clusters_dir) as entries:
            names = sorted(entry.name for entry in entries)
        for name in names:
            ref = _ref_of_folder(name)
            if ref is None:
                continue
            with contextlib.suppress(OSError), os.scandir(self.clusters_dir / name) as inside:
                if any(entry.name != LOCK_FILE for entry in inside):
                    found.append(ref)
        return sorted(found, key=lambda r: (r.namespace or "", r.kind, r.name))

    def refs(self) -> List[ClusterRef]:
        """Every cluster that has a readable record, sorted by name; others are skipped with a warning."""
        found = []
        with os.scandir(self.clusters_dir) as entries:
            folders = sorted(entry.name for entry in entries)
        for name in folders:
            try:
                ref = _ref_of_folder(name)
                if ref is not None and self.load(ref) is not None:
                    found.append(ref)
            except ScalingError as exc:
                logger.warning("skipping local cluster folder %s: %s", self.clusters_dir / name, exc)
        return sorted(found, key=lambda r: (r.namespace or "", r.kind, r.name))

    @contextlib.contextmanager
    def lock(self, ref: ClusterRef, timeout: float) -> Iterator[None]:
        """Hold ``ref``'s exclusive change lock, waiting at most ``timeout`` s (:class:`ConflictError`); a folder the
        block leaves holding nothing but the lock goes too."""
        folder = self.cluster_dir(ref)
        lock_path = folder / LOCK_FILE

        def busy() -> ConflictError:
            return ConflictError(
                f"another process kept the lock on local cluster {ref} for {seconds(timeout)} ({lock_path})",
                cluster=str(ref),
            )

        def in_use() -> bool:
            with os.scandir(folder) as entries:
                return any(entry.name != LOCK_FILE for entry in entries)

        def tidy() -> None:
            remove_unused(lock_path, in_use)
            if not os.path.lexists(lock_path):
                os.rmdir(folder)

        with exclusive(lock_path, timeout, busy, prepare=lambda: self.private_cluster_dir(ref), on_release=tidy):
            yield


def _check_marked(record: ClusterRecord, mark: Mark) -> None:
    """Refuse a record naming a running process that is not the cluster's (its environment lacks the mark,
    or another user runs it): only a hand-edited record names one, and acting on it would signal a stranger
    or stop the cluster's real head as unrecorded."""
    named = ([("scheduler", record.scheduler)] if record.scheduler else []) + [
        (f"workers[{index}]", worker.proc) for index, worker in enumerate(record.workers)
    ]
    for where, proc in named:
        # Only a definite "not ours" counts: a process between two programs of its chain or on its way out
        # shows no environment (no verdict), and one gone by the time it was read was the recorded one
        # only if it still is (a retired worker exits whenever it is done).
        if is_alive(proc) and mark.verdict(proc.pid) is False and is_alive(proc):
            raise InvalidInputError(
                f"{where}.pid", proc.pid,
                f"a process of this cluster ({CLUSTER_MARK_ENV}={mark.path} in its environment) or one that has exited",
            )


def _ref_of_folder(name: str) -> Optional[ClusterRef]:
    """The cluster a folder ``<namespace>.<kind>.<name>`` of the clusters folder is for; None for
    another name (a folder the user made)."""
    namespace, dot, rest = name.partition(".")
    kind, dot2, cluster = rest.partition(".")
    if not (dot and dot2):
        return None
    try:
        return ClusterRef(kind, cluster, None if namespace == "_" else namespace)
    except InvalidInputError:
        return None
