"""The process supervisor of the local backend: the head and worker processes of each cluster.

It spawns them detached from a :class:`~._driver.FrameworkDriver`'s command lines, records each, stops them
(retiring workers through the head first), keeps the head's ports and repairs a cluster whose processes died.
Callers hold the cluster lock (:meth:`ProcessSupervisor.lock`); every change first stops marked processes no
record holds and records its intent (:class:`~._state.PendingChange`) before it starts or stops anything.
"""
import contextlib
import logging
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, Callable, Iterator, List, Optional, Tuple

from ...errors import BackendUnavailableError, StateWriteError, TransientError, WorkerFailedError
from ...models import ClusterState
from ..._core.lifetime import pause_point
from .._support.crds import layout_of
from .._support.privatefs import remove_nofollow
from ...refs import ClusterRef
from ..._core.waiting import Deadline, probe_timeout
from . import _procs as procs
from ._driver import FrameworkDriver, LosesLiveWorkers
from ._state import ClusterRecord, LocalStateStore, PendingChange, WorkerRecord
from ._tiers import WorkerShape

logger = logging.getLogger("flytekitplugins_ddlscale.local")

HEAD_START_ATTEMPTS = 2
"""Starts of a head that exits while starting, before the start fails (see :meth:`ProcessSupervisor.start_cluster`)."""

HEAD_LOG = "scheduler"
"""Log name of the head process (``logs/scheduler.log`` in the cluster's folder)."""
INTERRUPTED = "Interrupted"
"""``ClusterState.status`` of a cluster whose last change was interrupted half-way (its process killed)."""


# Ports are chosen here and bound by the cluster's processes moments later, outside the kernel's range for
# outgoing connections (/proc/sys/net/ipv4/ip_local_port_range): a client socket of any program takes its
# local port from that range, and one landing on the chosen port before the bind makes the bind fail (Spark's
# daemons then exit, as they are told not to move). Only a server binding that very port can still take it.
OUTGOING_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000
"""Lowest port chosen: below it lie the ports services are commonly configured on, and Ray's default
range for its worker processes (10002-19999), where Ray refuses to find any other of its ports."""
TRIES = 200
"""Random ports probed outside the outgoing range before one the kernel assigns is taken instead."""
_PICK = random.SystemRandom()
"""Draws from the operating system: the user's own ``random`` sequence is left as it was."""


def outgoing_range() -> Tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default where unreadable)."""
    try:
        low, high = (int(part) for part in OUTGOING_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def port_is_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound right now (nothing else listens there)."""
    return _bindable(host, port, reuse_address=True)


def _bindable(host: str, port: int, reuse_address: bool) -> bool:
    # Without SO_REUSEADDR a port any socket holds (a connection's, one closing) counts as taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if reuse_address:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str, avoid: AbstractSet[int] = frozenset()) -> int:
    """A port no socket holds right now, not in ``avoid``, drawn outside the outgoing range: from
    :data:`LOWEST` up to it, or above it up to 65535 (one the kernel assigns, inside the range, only when
    :data:`TRIES` draws find none free); its user binds it moments later."""
    low, high = outgoing_range()
    below = range(LOWEST, low) if low > LOWEST else range(0)
    above = range(high + 1, 65536)
    candidates = [*below, *above]
    for _ in range(TRIES if candidates else 0):
        port = _PICK.choice(candidates)
        if port not in avoid and _bindable(host, port, reuse_address=False):
            return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = int(probe.getsockname()[1])
        if port not in avoid:
            return port


class ProcessSupervisor:
    """Starts, stops, observes and repairs the processes of local clusters, each through its kind's driver."""

    def __init__(
        self,
        store: LocalStateStore,
        driver_for: Callable[[ClusterRef], FrameworkDriver],
        *,
        start_timeout: float,
        stop_grace: float,
    ) -> None:
        self.store = store
        self.driver_for = driver_for
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace

    def _driver(self, record: ClusterRecord) -> FrameworkDriver:
        return self.driver_for(record.ref)

    def lock(self, ref: ClusterRef, timeout: float) -> "Iterator[None]":
        """The cluster's exclusive change lock (held by every change of its processes), at most ``timeout`` s."""
        return self.store.lock(ref, timeout)

    def mark(self, ref: ClusterRef) -> procs.Mark:
        """What every process of ``ref`` carries in its environment (the real path of the cluster's folder),
        and the user they run as (the folder's owner)."""
        return procs.Mark.of(self.store.cluster_dir(ref).absolute())

    def recorded(self, record: ClusterRecord) -> List[procs.ProcessId]:
        """Every process ``record`` holds (head and workers), running or not."""
        return ([record.scheduler] if record.scheduler else []) + [w.proc for w in record.workers]

    def unrecorded(self, record: Optional[ClusterRecord], ref: ClusterRef) -> List[procs.ProcessId]:
        """Running processes of ``ref`` that ``record`` does not hold, nor any process it holds started
        (all of them when there is no record)."""
        owners = self.recorded(record) if record is not None else []
        return [p for p in procs.marked_processes(self.mark(ref)) if not procs.belongs_to(p, owners)]

    def stop_unrecorded(self, record: Optional[ClusterRecord], ref: ClusterRef) -> List[procs.ProcessId]:
        """Stop :meth:`unrecorded` processes (left by a change killed half-way); return them."""
        stray = self.unrecorded(record, ref)
        if stray:
            logger.warning(
                "%s: stopping %d process(es) its record does not hold (pids %s), left by an interrupted change",
                ref, len(stray), [p.pid for p in stray],
            )
            procs.stop_processes(stray, self.mark(ref), self.stop_grace)
        return stray

    def head_alive(self, record: ClusterRecord) -> bool:
        """Whether the recorded head process is running."""
        return record.scheduler is not None and procs.is_alive(record.scheduler)

    # ------------------------------------------------------------ changing

    def converge(
        self, record: ClusterRecord, replicas: int, shape: WorkerShape, deadline: Optional[Deadline] = None
    ) -> Tuple[List[WorkerRecord], List[WorkerRecord]]:
        """Bring processes to ``replicas`` workers of ``shape``, repairing on the way (a dead head restarts
        with new workers, dead workers are replaced); returns the workers started and those of an old tier,
        left running for the caller to retire once the new ones are up."""
        with self._pending(record, replicas):
            started, old = self._converge(record, replicas, shape, deadline)
            record.worker_hw_tier, record.desired = shape.tier, replicas
        return started, old

    def _converge(
        self, record: ClusterRecord, replicas: int, shape: WorkerShape, deadline: Optional[Deadline]
    ) -> Tuple[List[WorkerRecord], List[WorkerRecord]]:
        started: List[WorkerRecord] = []
        old: List[WorkerRecord] = []
        if not self.head_alive(record):
            if record.workers:
                logger.warning("%s: the %s had exited; restarting it and its workers", record.ref, self._driver(record).head_label)
            self.stop_all(record)
            self._move_off_taken_ports(record)
            started = self.start_cluster(record, shape, replicas, deadline=deadline)
        else:
            lost = [w.name for w in record.workers if not procs.is_alive(w.proc)]
            if lost:
                logger.warning("%s: worker process(es) %s had exited; replacing them", record.ref, lost)
            self._stop_finished(record)
            record.workers = [w for w in record.workers if procs.is_alive(w.proc)]
            same = [w for w in record.workers if w.tier == shape.tier]
            old = [w for w in record.workers if w.tier != shape.tier]
            if len(same) < replicas:
                started = self.start_workers(record, shape, replicas - len(same))
            elif len(same) > replicas:
                self.stop_workers(record, same[replicas:], retire=True)
        return started, old

    def _stop_finished(self, record: ClusterRecord) -> None:
        """Stop the workers the head has given up on (:class:`LosesLiveWorkers`): they are replaced like exited ones."""
        driver = self._driver(record)
        finished = driver.finished_workers(record) if isinstance(driver, LosesLiveWorkers) else set()
        if finished:
            logger.warning(
                "%s: worker(s) %s left by the %s (decommissioned); replacing them",
                record.ref, sorted(finished), driver.head_label,
            )
            self.stop_workers(record, [w for w in record.workers if w.name in finished], retire=False)

    def restart_head(self, record: ClusterRecord, shape: WorkerShape) -> List[WorkerRecord]:
        """Stop every process, then start the head on the same port (a new one where something else holds
        it now, as a repair does) and the same-named workers again."""
        names = [w.name for w in record.workers if w.tier == shape.tier][: record.desired]
        with self._pending(record, record.desired):
            self.stop_all(record)
            self._move_off_taken_ports(record)
            return self.start_cluster(record, shape, record.desired, names=names)

    def _move_off_taken_ports(self, record: ClusterRecord) -> bool:
        """With every process stopped: forget the head's ports when something else holds one now (another
        user's listener after a crash), so the next start chooses new ones. Whether it moved."""
        taken = [p for p in [record.port, *record.ports.values()] if p and not port_is_free(record.host, p)]
        if taken:
            logger.warning("%s: port(s) %s taken now; the %s moves", record.ref, taken, self._driver(record).head_label)
            record.port, record.ports = 0, {}
        return bool(taken)

    @contextlib.contextmanager
    def _pending(self, record: ClusterRecord, replicas: int) -> Iterator[None]:
        """Stop what the record does not hold and record the change as pending (intent first), cleared once the
        block is done, or raised an error (its spawns are recorded or stopped); an interruption (Ctrl-C,
        SIGTERM) may land between a spawn and its record, so it leaves the mark."""
        self.stop_unrecorded(record, record.ref)
        record.pending = PendingChange(replicas)
        self.store.save(record)
        try:
            yield
        except Exception:
            record.pending = None
            with contextlib.suppress(StateWriteError):
                self.store.save(record)
            raise
        record.pending = None
        self.store.save(record)

    def start_cluster(
        self, record: ClusterRecord, shape: WorkerShape, count: int, names: Optional[List[str]] = None,
        deadline: Optional[Deadline] = None,
    ) -> List[WorkerRecord]:
        """Start the head and ``count`` workers together; stop them all if the head fails to answer. Past
        ``deadline`` (the operation's) they are left starting, recorded, for the operation's wait to say so.
        A head that exits while starting is started once more with the same workers (a loaded machine can
        make a Ray head's client server give up), on new ports when this start chose them (a port found free
        can be taken before the head binds it)."""
        attempts_left = HEAD_START_ATTEMPTS
        ports_chosen_here = record.port == 0
        while True:
            attempts_left -= 1
            self._start_head(record)
            started = self.start_workers(record, shape, count, names=names)
            try:
                self._await_head(record, operation=deadline)
                return started
            except HeadExitedError as exc:
                self.stop_all(record)
                if not attempts_left:
                    raise
                logger.warning("%s; starting it once more", str(exc).split(";", 1)[0])
                names = [worker.name for worker in started]
                # A port taken between the check and the head's bind (another user's listener) moves too.
                if not self._move_off_taken_ports(record) and ports_chosen_here:
                    record.port, record.ports = 0, {}
            except TransientError:
                self.stop_all(record)
                raise

    def start_workers(
        self, record: ClusterRecord, shape: WorkerShape, count: int, names: Optional[List[str]] = None
    ) -> List[WorkerRecord]:
        """Spawn ``count`` workers of ``shape`` (named ``names`` first, then new names); do not wait."""
        started = []
        driver = self._driver(record)
        workdir = self.store.private_cluster_dir(record.ref, "work")
        for index in range(count):
            if names is not None and index < len(names):
                name = names[index]
            else:
                name = f"{layout_of(record.ref).worker_pod_prefix(record.ref.name)}{record.next_index}"
                record.next_index += 1
            proc = self._spawn(record, driver.worker_argv(record, name, shape, workdir), name)
            worker = WorkerRecord(name, proc, shape.tier, shape.nthreads, shape.memory_limit)
            record.workers.append(worker)
            started.append(worker)
            pause_point("worker-started")
            # Saved after each spawn, so a crash leaves at most one worker unrecorded (and marked).
            self._save_or_stop(record, proc, lambda: record.workers.remove(worker))
        return started

    def stop_workers(self, record: ClusterRecord, workers: List[WorkerRecord], retire: bool) -> None:
        """Retire ``workers`` through the head (data moves off them), then make sure they exit; each step
        within what is left of the operation (:func:`~flytekitplugins_ddlscale._core.waiting.within`)."""
        if not workers:
            return
        retired = False
        if retire and self.head_alive(record):
            try:
                names = [w.name for w in workers]
                grace = probe_timeout(self.stop_grace, f"the retirement of {names} by the {self._driver(record).head_label}")
                retired = self._driver(record).retire_workers(record, names, grace)
            except TransientError as exc:
                logger.warning("%s; terminating the workers instead", exc.message)
        procs.stop_processes([w.proc for w in workers], self.mark(record.ref), self.stop_grace, asked=retired)
        gone = {w.name for w in workers}
        record.workers = [w for w in record.workers if w.name not in gone]
        self.store.save(record)

    def drop_dead(self, record: ClusterRecord, workers: List[WorkerRecord]) -> None:
        """Forget those of ``workers`` whose process has exited (the others keep running)."""
        self.stop_workers(record, [w for w in workers if not procs.is_alive(w.proc)], retire=False)

    def stop_all(self, record: ClusterRecord) -> None:
        """Stop every process: the head first where it closes its workers cleanly (then any worker
        still running), else the workers first, while their head can still take their drain."""
        self._stop_recorded(record)
        record.scheduler = None
        record.workers = []
        self.store.save(record)

    def _stop_recorded(self, record: ClusterRecord) -> None:
        workers = [w.proc for w in record.workers]
        mark = self.mark(record.ref)
        if self._driver(record).workers_exit_with_head:
            closing = self.head_alive(record)
            if record.scheduler is not None:
                procs.stop_processes([record.scheduler], mark, self.stop_grace)
            procs.stop_processes(workers, mark, self.stop_grace, asked=closing)
        else:
            procs.stop_processes(workers, mark, self.stop_grace)
            if record.scheduler is not None:
                procs.stop_processes([record.scheduler], mark, self.stop_grace)

    def take_down(self, record: Optional[ClusterRecord], ref: ClusterRef) -> "TakenDown":
        """Stop every process of ``ref`` (those ``record`` holds, None when missing or unreadable, and every other
        one carrying its mark) and remove its folder (but its lock) and its framework's folders elsewhere,
        never following a link. Returns what was found running."""
        recorded = [p for p in self.recorded(record) if procs.is_alive(p)] if record is not None else []
        stray = self.unrecorded(record, ref)
        outside = self._driver(record).outside_paths(record, self.store) if record is not None else []
        try:
            if record is not None:
                self._stop_recorded(record)  # not saved: the record goes, and a read-only folder must not stop this
        finally:
            # Whatever still carries the mark, even when stopping the recorded ones failed: the unrecorded
            # processes, and anything the recorded ones started that outlived them.
            procs.stop_processes(procs.marked_processes(self.mark(ref)), self.mark(ref), self.stop_grace)
        self.store.delete(ref)
        for path in outside:
            remove_nofollow(path)
        return TakenDown(ref, [p.pid for p in recorded], [p.pid for p in stray])

    # ----------------------------------------------------------- observing

    def observe(self, record: ClusterRecord) -> ClusterState:
        """Live processes, and the workers of the cluster's tier the head reports as registered."""
        seen = self._driver(record).registered_workers(record) if self.head_alive(record) else None
        alive = [w for w in record.workers if procs.is_alive(w.proc)]
        ready = 0
        if seen is not None:
            ready = sum(1 for w in alive if w.name in seen and w.tier == record.worker_hw_tier)
        if record.pending is not None and record.pending.interrupted():
            status = INTERRUPTED
        elif seen is None:
            status = "Failed"
        elif ready == record.desired and len(alive) == record.desired:
            status = "Running"
        elif len(alive) > record.desired and all(w.name in seen for w in alive):
            # Workers start before the record's desired count is raised; only
            # surplus workers that already joined are on their way out.
            status = "Stopping"
        else:
            status = "Starting"
        return ClusterState(
            cluster=str(record.ref),
            status=status,
            desired_workers=record.desired,
            existing_workers=len(alive),
            ready_workers=ready,
            head_ready=seen is not None,
            worker_hw_tier=record.worker_hw_tier or None,
            head_hw_tier=record.head_hw_tier,
        )

    def check_started(self, record: ClusterRecord, started: List[WorkerRecord], state: ClusterState) -> None:
        """Raise when a worker of ``started`` exited before joining, or the head exited, quoting its log."""
        for worker in started:
            if not procs.is_alive(worker.proc) and worker in record.workers:
                log = self.store.log_path(record.ref, worker.name)
                raise WorkerFailedError(
                    f"local {self._driver(record).framework} worker {worker.name} exited before joining; {log}:\n"
                    f"{procs.log_tail(log)}",
                    pod=worker.name,
                    reason="ProcessExited",
                    cluster=str(record.ref),
                    state=state,
                )
        if not self.head_alive(record):
            log = self.store.log_path(record.ref, HEAD_LOG)
            raise BackendUnavailableError(
                f"the {self._driver(record).head_label} of {record.ref} exited; {log}:\n{procs.log_tail(log)}",
                cluster=str(record.ref),
                state=state,
            )

    # ------------------------------------------------------------ internals

    def _start_head(self, record: ClusterRecord) -> None:
        """Start the head on the recorded port (a free one for a new cluster); do not wait: workers may
        start at once, since they keep trying to connect, and :meth:`_await_head` waits for the head."""
        taken = {record.port, *record.ports.values()}
        if record.port == 0:
            record.port = free_port(record.host, taken)
            taken.add(record.port)
        for name in self._driver(record).head_ports:
            if not record.ports.get(name):
                record.ports[name] = free_port(record.host, taken)
                taken.add(record.ports[name])
        record.scheduler = self._spawn(record, self._driver(record).head_argv(record, self.store), HEAD_LOG)
        pause_point("head-started")
        self._save_or_stop(record, record.scheduler, lambda: setattr(record, "scheduler", None))

    def _spawn(self, record: ClusterRecord, argv: List[str], log_name: str) -> procs.ProcessId:
        # In the cluster's private folder: the caller's working directory may hold anything (an inspect.py).
        return procs.spawn_detached(
            argv, self.store.log_path(record.ref, log_name), self.mark(record.ref),
            self.store.private_cluster_dir(record.ref),
        )

    def _save_or_stop(self, record: ClusterRecord, proc: procs.ProcessId, forget: Callable[[], None]) -> None:
        """Record ``proc``; when the record cannot be written, stop ``proc`` (and what it started) and
        ``forget`` it, so no process runs that the records do not hold."""
        try:
            self.store.save(record)
        except StateWriteError:
            logger.warning("%s: stopping process %d: its record could not be written", record.ref, proc.pid)
            procs.stop_processes([proc], self.mark(record.ref), self.stop_grace)
            forget()
            raise

    def _await_head(self, record: ClusterRecord, operation: Optional[Deadline] = None) -> None:
        """Wait up to ``start_timeout`` until the head is ready (:meth:`FrameworkDriver.head_ready`);
        :class:`HeadExitedError` if it exits first, :class:`BackendUnavailableError` if it does not
        answer in time, each quoting its log. Returns at ``operation`` deadline with the head still starting."""
        log = self.store.log_path(record.ref, HEAD_LOG)
        limit = time.monotonic() + self.start_timeout
        while not self._driver(record).head_ready(record):
            if operation is not None and operation.expired:
                logger.info("%s: the operation's timeout ran out while its %s was starting", record.ref,
                            self._driver(record).head_label)
                return
            if not self.head_alive(record):
                raise HeadExitedError(
                    f"the {self._driver(record).head_label} of {record.ref} exited while starting on port "
                    f"{record.port}; {log}:\n{procs.log_tail(log)}",
                    cluster=str(record.ref),
                )
            if time.monotonic() >= limit:
                raise BackendUnavailableError(
                    f"the {self._driver(record).head_label} of {record.ref} did not answer within "
                    f"{self.start_timeout:.0f}s; {log}:\n{procs.log_tail(log)}",
                    cluster=str(record.ref),
                )
            time.sleep(0.05)


@dataclass(frozen=True)
class TakenDown:
    """What ``down`` found running: pids the record held, and pids it did not (stopped all the same)."""

    ref: ClusterRef
    recorded: List[int]
    unrecorded: List[int]


class HeadExitedError(BackendUnavailableError):
    """The head process exited before it was ready."""
