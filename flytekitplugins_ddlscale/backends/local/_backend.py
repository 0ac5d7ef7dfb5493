"""The local backend's protocol layer: real local clusters made of local processes.

A local cluster is one head process plus one process per worker, detached and recorded (pid and start
time) in the state directory, so tasks, processes and the ``ddlscale local`` CLI share it; every change
holds the cluster's lock, and ``ready_workers`` counts the workers the head reports. This module holds what
the protocol means locally (baselines and claims on files through :class:`FileRecordsBackend`, the cap at
``max_workers``, waits); the processes are the :class:`~._supervisor.ProcessSupervisor`'s, and what is
particular to a framework is its driver's (:mod:`._driver`).
"""
import contextlib
import logging
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from ...errors import (
    CapacityExceededError,
    ClusterNotFoundError,
    ConflictError,
    CorruptRecordError,
    InterruptedChangeError,
    InvalidInputError,
    ScalingError,
    ScalingTimeoutError,
    WorkerFailedError,
)
from .._support.crds import layout_of
from .._support.filerecords import FileBookkeeping
from .._support.filestore import FileRecordStore
from .._support.inplace import Reach, state_dir_env
from ...models import Baseline, ClusterState, ReplicaSpec, RestartResult, ScaleResult, utcnow
from ..._core import settings
from ..._core.progress import ProgressReporter, plural
from ..._core.records import Claim
from ...refs import ClusterRef
from ..._core.validation import validate_replicas, validate_timeout
from ..._core.leases import dead_text
from ..._core.lifetime import environ_set
from ..._core.waiting import Awaited, Backoff, CLEANUP_GRACE, Deadline, Pacing, poll_until, within
from .._base import DEFAULT_SCALE_TIMEOUT, BackendCapabilities, Change, SharedReads, WorkersWait
from .._filebacked import FileRecordsBackend
from . import _procs as procs
from ._driver import SERVED_KINDS, FrameworkDriver, check_platform, load_driver, served_frameworks
from ._state import ClusterRecord, LocalStateStore, WorkerRecord
from ._supervisor import ProcessSupervisor, TakenDown
from ._tiers import WorkerShape, default_tier_name, load_catalog

logger = logging.getLogger("flytekitplugins_ddlscale.local")

DEFAULT_MAX_WORKERS = 16
"""Most workers one local cluster may have unless the constructor says otherwise."""
STOPPED = "Stopped"
"""``ClusterState.status`` of a local cluster that does not exist (before first use, after ``down``)."""
_POLL = Backoff(initial=0.1, factor=1.5, cap=0.5)
CORRUPT = "Corrupt"
"""``status`` in :meth:`LocalBackend.survey` of a cluster whose ``cluster.json`` cannot be used."""
UNRECORDED = "Unrecorded"
"""``status`` in :meth:`LocalBackend.survey` of a cluster with processes running and no record."""
DESIRED = "desired_workers"
"""What holds a local cluster's size, as named in errors (``ClusterState.desired_workers``)."""
LOOPBACK_HOSTS = ("127.0.0.1",)
"""Where local clusters may listen: they are single-user, and nothing but loopback may reach them
(``::1`` is not offered: Ray and Spark were checked to hold every listener to 127.0.0.1 only)."""


@dataclass
class _Started:
    """What a change did to the processes, for the wait that follows it under the lock."""

    record: ClusterRecord
    started: List[WorkerRecord]
    old: List[WorkerRecord]
    """Workers of the previous tier, retired once the new ones are up."""


class LocalBackend(FileRecordsBackend):
    """Real local clusters, the default backend when nothing else is configured.

    ``state_dir`` defaults to ``$DDLSCALE_STATE_DIR/local``; ``tiers_file`` to ``$DDLSCALE_LOCAL_TIERS``, else
    the packaged ``data/local_tiers.yaml``; ``host`` must be loopback (:data:`LOOPBACK_HOSTS`);
    ``max_workers`` plays a cluster's ``maxReplicas`` (above it a scale is capped, or refused when
    ``strict``). The kinds of :data:`~._driver.SERVED_KINDS` are served, on the platforms
    :func:`~._driver.check_platform` names; others raise :class:`UnsupportedOperationError`.

    A scale starts or stops worker processes, creating the cluster if needed (to 0 workers it creates
    nothing); a new tier replaces every worker, the old ones retired once the new ones are up. A failed
    wait rolls nothing back. A restore takes down a cluster a scale created (not ``up``) whose baseline is
    no workers, so a flow leaves nothing running. ``close`` releases nothing: clusters outlive this object
    (:meth:`down`).
    """

    name = "local"
    locked_step_seconds = None  # no outages here: a head that does not start fails the change
    size_setting = DESIRED
    maximum_setting = "max_workers"
    capabilities = BackendCapabilities(
        SERVED_KINDS, observes_restarts=True, repairs_processes=True, counts_registered_workers=True,
        reads_locally=True, creates_clusters=True,
    )

    @classmethod
    def stop_command(cls, ref: ClusterRef) -> str:
        """``ddlscale local down``: a local cluster a flow started is taken down, not restored (``--kind``
        named unless it is the command's default, dask)."""
        kind = "" if ref.kind == "dask" else f"--kind {ref.kind} "
        return f"ddlscale local down {kind}--name {ref.name}"

    def __init__(
        self,
        state_dir: Union[str, Path, None] = None,
        tiers_file: Union[str, Path, None] = None,
        *,
        host: str = "127.0.0.1",
        max_workers: int = DEFAULT_MAX_WORKERS,
        start_timeout: float = 60.0,
        stop_grace: float = 5.0,
    ) -> None:
        check_platform(sys.platform)
        if host not in LOOPBACK_HOSTS:
            raise InvalidInputError(
                "host", host, " or ".join(LOOPBACK_HOSTS),
                reason="local clusters are single-user and listen on loopback only",
            )
        # Read now, before anything starts: every scheduler gets it (a bad value would break each one).
        settings.WATCH_GRACE.value()
        self.store = LocalStateStore(state_dir)
        self.host = host
        self.max_workers = validate_replicas(max_workers, field="max_workers")
        self.start_timeout = validate_timeout(start_timeout, field="start_timeout")
        self.stop_grace = validate_timeout(stop_grace, field="stop_grace")
        self.catalog = load_catalog(tiers_file)
        self.records = FileBookkeeping(FileRecordStore(self.store.records_dir))
        self._drivers: Dict[str, FrameworkDriver] = {}
        self.supervisor = ProcessSupervisor(
            self.store, self.driver, start_timeout=self.start_timeout, stop_grace=self.stop_grace
        )

    def driver(self, ref: ClusterRef) -> FrameworkDriver:
        """The driver of ``ref``'s framework (loaded on first use of its kind)."""
        if ref.kind not in self._drivers:
            self._drivers[ref.kind] = load_driver(ref.kind)
        return self._drivers[ref.kind]

    # ----------------------------------------------------------- observing

    def _observe(self, ref: ClusterRef) -> ClusterState:
        """Live processes and the workers the scheduler sees; :class:`ClusterNotFoundError` when no
        local cluster ``ref`` exists."""
        return self.supervisor.observe(self._load(ref))

    def _observe_for_wait(self, ref: ClusterRef, replicas: int, deadline: Deadline) -> ClusterState:
        return self._observe(ref)

    def _maximum(self, state: ClusterState) -> int:
        return self.max_workers

    def list_clusters(self) -> List[ClusterRef]:
        """Every local cluster recorded in the state directory (with a readable record)."""
        return self.store.refs()

    def survey(self) -> List[Dict[str, Any]]:
        """Every cluster folder of the state directory, each :meth:`describe`d; one whose record is
        corrupt, or missing while processes of it run, is listed with ``status`` ``Corrupt`` or
        ``Unrecorded``, the error, and the pids of its running processes (``down`` stops them)."""
        found = []
        for ref in self.store.folders():
            try:
                found.append(self.describe(ref))
            except ScalingError as exc:
                # One broken cluster folder is one line of the list, never the end of it.
                running = [p.pid for p in self.supervisor.unrecorded(None, ref)]
                corrupt = not isinstance(exc, ClusterNotFoundError)
                if corrupt or running:
                    found.append({
                        "cluster": str(ref), "kind": ref.kind, "name": ref.name,
                        "status": CORRUPT if corrupt else UNRECORDED, "error": str(exc) if corrupt else None,
                        "desired_workers": None, "ready_workers": None, "worker_hw_tier": None, "address": None,
                        "unrecorded_pids": running,
                    })
        return found

    def describe(self, ref: ClusterRef) -> Dict[str, Any]:
        """A JSON-ready report of ``ref``: state, head address, connection variables, processes."""
        self._served(ref)
        record = self._load(ref)
        state = self.supervisor.observe(record)
        driver = self.driver(ref)
        return {
            "cluster": str(ref),
            "kind": ref.kind,
            "name": ref.name,
            "status": state.status,
            "desired_workers": state.desired_workers,
            "existing_workers": state.existing_workers,
            "ready_workers": state.ready_workers,
            "head_ready": state.head_ready,
            "worker_hw_tier": state.worker_hw_tier,
            "head_hw_tier": state.head_hw_tier,
            "address": driver.address(record),
            "env": driver.connection_env(record),
            **driver.details(record, self.store),
            "scheduler_pid": record.scheduler.pid if record.scheduler else None,
            "workers": [
                {**w.to_json(), "alive": procs.is_alive(w.proc)} for w in record.workers
            ],
            "ephemeral": record.ephemeral,
            "created_at": record.created_at,
            "pending": record.pending.to_json() if record.pending else None,
            "unrecorded_pids": [p.pid for p in self.supervisor.unrecorded(record, ref)],
            "dead_claims": self._dead_claims_text(ref),
            "logs": str(self.store.cluster_dir(ref) / "logs"),
            "observed_at": state.observed_at.isoformat(),
        }

    def _dead_claims_text(self, ref: ClusterRef) -> List[str]:
        """What each dead claim still on record held (:func:`dead_text`), or the claims record's error."""
        try:
            dead = self.dead_claims(ref)
        except CorruptRecordError as exc:
            return [str(exc)]
        return [dead_text(claim) for claim, _ in sorted(dead.values(), key=lambda pair: pair[0].created_at)]

    def connection_env(self, ref: ClusterRef) -> Dict[str, str]:
        """The variables Domino injects in a run for ``ref``'s framework (e.g.
        ``DASK_SCHEDULER_SERVICE_HOST``/``_PORT``), naming this local head."""
        self._served(ref)
        return self.driver(ref).connection_env(self._load(ref))

    @contextlib.contextmanager
    def connected(self, ref: ClusterRef) -> Iterator[Dict[str, str]]:
        """Set :meth:`connection_env` in ``os.environ`` for the block, then restore the old values."""
        with environ_set(self.connection_env(ref)) as values:
            yield values

    # ------------------------------------------------------------ changing

    def up(
        self,
        ref: ClusterRef,
        replicas: int = 1,
        worker_hw_tier: Optional[str] = None,
        *,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        progress: Optional[ProgressReporter] = None,
    ) -> ScaleResult:
        """Create (or resize) a cluster that stays until :meth:`down`; no baseline recorded: it is the operator
        setting the size a later flow's baseline will see."""
        replicas, tier, deadline = self._check_size_request(ref, replicas, worker_hw_tier, timeout)
        with self._changing(ref, deadline):
            change = self._apply(ref, replicas, tier, by_operator=True, deadline=deadline)
        # ``up`` records no baseline, so a failed wait has nothing to restore: its error says what it left.
        try:
            return self._finish(ref, change, True, deadline, progress, explain=False)
        except (ScalingTimeoutError, WorkerFailedError) as error:
            raise self._left_by_up(ref, error, min(replicas, self.max_workers)) from None

    def _left_by_up(self, ref: ClusterRef, error: ScalingError, replicas: int) -> ScalingError:
        """``error`` of an ``up`` whose wait failed, naming what it left running (the size it set stays,
        so late workers still join) and what stops it."""
        reach = self._reach(ref)
        error.left_in_place = f"{DESIRED}={replicas}"
        if reach.cli:
            env = "".join(f"{name}={shlex.quote(value)} " for name, value in reach.env.items())
            error.remedy_command = f"{env}{self.stop_command(ref)}"
        error.remedy_call = reach.call("down")
        stop = f"`{error.remedy_command}`" if error.remedy_command else f"`{error.remedy_call}`"
        error.message = (
            f"{error.message}; left running: {ref} with {error.left_in_place} (`up` rolls nothing back, its workers "
            f"may still join); to stop it: {stop}"
        )
        error.args = (error.message,)
        return error

    def repair(
        self,
        ref: ClusterRef,
        *,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        progress: Optional[ProgressReporter] = None,
    ) -> ClusterState:
        """Restart a dead head (same port) and missing workers, up to ``max_workers``; the state once whole.
        :class:`InterruptedChangeError` for a record a change interrupted half-way left."""
        self._served(ref)
        timeout = validate_timeout(timeout)
        with self.supervisor.lock(ref, timeout):
            record = self._whole(self._load(ref), "repair")
            shape = self._shape(ref, record.worker_hw_tier or None, field="worker_hw_tier")
            replicas = min(record.desired, self.max_workers)
            started, _ = self.supervisor.converge(record, replicas, shape)
            if started:
                logger.info("repaired %s: restarted %d worker(s)", ref, len(started))
            return self._wait_started(record, started, replicas, timeout, progress)

    def _restart_head(
        self, ref: ClusterRef, head_hw_tier: Optional[str], wait: bool, deadline: Deadline,
        progress: Optional[ProgressReporter],
    ) -> RestartResult:
        """Restart the head on the same port with the same-named workers; with ``wait``, until every worker is
        back. ``head_hw_tier`` (a known tier) is recorded and reported; it does not limit a local process."""
        timeout = deadline.timeout
        head_tier = self.catalog.resolve(head_hw_tier, ref.kind, field="head_hw_tier")
        began = time.monotonic()
        with self.supervisor.lock(ref, timeout):
            record = self._whole(self._load(ref), "restart-head")
            shape = self._shape(ref, record.worker_hw_tier or None, field="worker_hw_tier")
            started_at = utcnow().isoformat()
            if head_tier is not None:
                record.head_hw_tier = head_tier.name
            record.desired = min(record.desired, self.max_workers)
            started = self.supervisor.restart_head(record, shape)
            if wait:
                final = self._wait_started(record, started, record.desired, timeout, progress)
            else:
                final = self.supervisor.observe(record)
        return RestartResult(
            cluster=str(ref),
            pod=layout_of(ref).head_pod_name(ref.name) or "scheduler",
            started_at=started_at,
            ready=bool(final.head_ready),
            final=final,
            waited=wait,
            seconds_waited=time.monotonic() - began if wait else 0.0,
            head_hw_tier=head_hw_tier,
        )

    def _head_restarted(
        self, ref: ClusterRef, restart: RestartResult, reads: Optional[SharedReads]
    ) -> Tuple[bool, ClusterState]:
        """The head ``restart_head`` started is the one running (it replaced the old one before
        returning), so the restart is done once that head and every desired worker are Ready."""
        state = self.get_state(ref)
        return bool(state.head_ready) and state.workers_up(state.desired_workers), state

    def down(self, ref: ClusterRef, *, timeout: float = 60.0) -> bool:
        """Stop every process of ``ref`` and forget it (baseline and claims too); False when there was none."""
        return self.take_down(ref, timeout=timeout) is not None

    def take_down(self, ref: ClusterRef, *, timeout: float = 60.0) -> Optional[TakenDown]:
        """Stop every process carrying ``ref``'s mark, recorded or not, and forget it (a corrupt record too);
        what was found running, or None when there was no such cluster."""
        self._served(ref)
        with self.supervisor.lock(ref, validate_timeout(timeout)):
            try:
                record = self.store.load(ref)
            except CorruptRecordError as exc:
                logger.warning("%s: taking it down without its record: %s", ref, exc.message)
                record = None
            else:
                if record is None and not self.supervisor.unrecorded(None, ref):
                    return None
            taken = self.supervisor.take_down(record, ref)
        self.records.store.remove(ref)
        return taken

    def shutdown_all(self, failures: Optional[List[ScalingError]] = None) -> List[ClusterRef]:
        """Take down every local cluster in the state directory (corrupt or unrecorded ones too);
        return the ones stopped. One that cannot be taken down does not keep the others up: its error is
        added to ``failures`` when a list is given, else the first one is raised once the others are down."""
        stopped: List[ClusterRef] = []
        failed: List[ScalingError] = [] if failures is None else failures
        for ref in self.store.folders():
            try:
                if self.down(ref):
                    stopped.append(ref)
            except ScalingError as exc:
                failed.append(exc)
        if failed and failures is None:
            raise failed[0]
        return stopped

    # ------------------------------------------------- baselines and claims

    def _observe_for_baseline(self, ref: ClusterRef) -> ClusterState:
        """The current size and tiers (0 workers if the cluster is new)."""
        return self._observe_or_absent(ref)

    def _claim(
        self, ref: ClusterRef, claim_id: str, replicas: int, tier: Optional[str], lease_seconds: float,
        timeout: Optional[float],
    ) -> Claim:
        # The cluster lock keeps a claim from recording a size while a change is half-way through
        # changing the processes; changes hold it only while they start or stop processes.
        began = time.monotonic()
        bound = timeout if timeout is not None else self.records.store.lock_timeout
        with self.supervisor.lock(ref, bound):
            left = max(bound - (time.monotonic() - began), 0.1)
            return super()._claim(ref, claim_id, replicas, tier, lease_seconds, left)

    # ------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _changing(self, ref: ClusterRef, deadline: Deadline) -> Iterator[None]:
        """The cluster's lock while a change starts or stops processes (not during the wait that follows),
        its checks cut to what is left of ``deadline``."""
        with within(deadline), self.supervisor.lock(ref, max(deadline.remaining, 0.1)):
            yield

    def _observe_before_change(self, ref: ClusterRef, deadline: Deadline, what: str) -> ClusterState:
        return self._observe_or_absent(ref)

    def _check_size(self, previous: ClusterState, replicas: int, strict: bool) -> None:
        if strict and replicas > self.max_workers:
            raise CapacityExceededError(
                f"asked for {replicas} workers; this local backend allows at most "
                f"{self.max_workers} (LocalBackend(max_workers=...))",
                cluster=previous.cluster,
            )

    def _nothing_to_change(self, ref: ClusterRef, previous: ClusterState, replicas: int) -> Optional[ScaleResult]:
        return self._creates_nothing(ref, replicas, by_operator=False)

    def _creates_nothing(self, ref: ClusterRef, replicas: int, by_operator: bool) -> Optional[ScaleResult]:
        """The unchanged result for 0 workers on a cluster that does not exist (e.g. a phase already
        took it down): a scheduler holding no workers would only be left running."""
        if by_operator or min(replicas, self.max_workers) > 0 or self.store.load(ref) is not None:
            return None
        logger.info(
            "%s does not exist; scaling it to 0 workers changes nothing (no scheduler started, no baseline recorded)",
            ref,
        )
        return _unchanged(_absent(ref), requested=replicas)

    def _apply_size(
        self, ref: ClusterRef, replicas: int, tier: Optional[str], previous: ClusterState, deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        return self._apply(ref, replicas, tier, by_operator=False, deadline=deadline)

    def _apply_baseline(
        self, ref: ClusterRef, baseline: Optional[Baseline], target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        """A cluster that a scale created (not ``up``) whose baseline is "no workers" is taken
        down entirely, so a flow leaves nothing running."""
        wanted = target
        if wanted is None:
            assert baseline is not None
            record = self.store.load(ref)
            if record is None or (record.ephemeral and baseline.replicas == 0):
                return self._down_locked(ref, record)
            wanted = ReplicaSpec(baseline.replicas, baseline.worker_hw_tier, baseline.head_hw_tier)
        change = self._apply(ref, wanted.replicas, wanted.worker_hw_tier, by_operator=False, deadline=deadline)
        if isinstance(change, ScaleResult):
            return change
        if wanted.head_hw_tier is not None:
            change.detail.record.head_hw_tier = wanted.head_hw_tier
            self.store.save(change.detail.record)
        change.restoring = True
        return change

    def _no_baseline(self, ref: ClusterRef) -> ScaleResult:
        """Nothing recorded to put back: the cluster unchanged, or :class:`ClusterNotFoundError` when there is
        none (as the scaler and Kubernetes backends answer, and ``status`` exits)."""
        return _unchanged(self._observe(ref))

    def _apply(
        self, ref: ClusterRef, replicas: int, worker_hw_tier: Optional[str], *, by_operator: bool,
        deadline: Optional[Deadline] = None,
    ) -> Union[Change, ScaleResult]:
        """Start or stop processes for ``replicas`` workers (capped at ``max_workers``); no waiting beyond
        ``deadline`` (a new head still starting then is left to the operation's wait, which times out)."""
        unchanged = self._creates_nothing(ref, replicas, by_operator)
        if unchanged is not None:
            return unchanged
        effective = min(replicas, self.max_workers)
        existing = self.store.load(ref)
        previous = self.supervisor.observe(existing) if existing is not None else _absent(ref)
        record = existing or ClusterRecord(ref=ref, host=self.host, ephemeral=not by_operator)
        record.ephemeral = record.ephemeral and not by_operator
        shape = self._shape(ref, worker_hw_tier or record.worker_hw_tier or None, field="worker_hw_tier")
        started, old = self.supervisor.converge(record, effective, shape, deadline)
        result = ScaleResult.sent(str(ref), previous, replicas, effective, worker_hw_tier=worker_hw_tier)
        return Change(result, detail=_Started(record, started, old))

    def _wait_workers(self, ref: ClusterRef, wait: WorkersWait) -> ClusterState:
        if wait.change is None:
            return self._poll(lambda: self._observe(ref), ref, wait.replicas, wait.timeout, wait.progress)
        detail = wait.change.detail
        return self._wait_started(detail.record, detail.started, wait.replicas, wait.timeout, wait.progress)

    def _unwaited(self, ref: ClusterRef, change: Change) -> ClusterState:
        return self.supervisor.observe(change.detail.record)

    def _wait_failed(self, ref: ClusterRef, change: Change) -> None:
        """Only the processes that died are dropped: the new size stays in place. A clean-up after the
        operation's timeout, so it waits at most :data:`CLEANUP_GRACE` for the lock; a change holding it
        longer leaves them to the next change (which drops dead workers too), and the wait's error stands."""
        try:
            with self.supervisor.lock(ref, min(self.records.store.lock_timeout, CLEANUP_GRACE)):
                record = self.store.load(ref)
                if record is not None:
                    self.supervisor.drop_dead(record, [w for w in change.detail.started if w in record.workers])
        except ConflictError as exc:
            logger.warning("%s: the workers that died are not dropped now: %s", ref, exc.message)

    def _settled(self, ref: ClusterRef, change: Change, final: ClusterState, waited: bool) -> ClusterState:
        """Old-tier workers are retired once the new ones are up (those a later change kept are not)."""
        started: _Started = change.detail
        if not started.old:
            return final
        with self.supervisor.lock(ref, self.records.store.lock_timeout):
            record = self.store.load(ref)
            if record is None:
                return final
            retiring = [w for w in started.old if w in record.workers and w.tier != record.worker_hw_tier]
            self.supervisor.stop_workers(record, retiring, retire=True)
            return self.supervisor.observe(record) if waited else final

    def _reach(self, ref: ClusterRef) -> Reach:
        """How ``ddlscale`` and a new process find this state directory (hence the baseline)."""
        env = state_dir_env(self.store.root, "local")
        if env == {}:
            return Reach(self.name, ref)
        options = {"state_dir": str(self.store.root.resolve())}
        return Reach(self.name, ref, env=env or {}, options=options, cli=env is not None)

    def _check_tier(self, ref: ClusterRef, tier: Optional[str], field: str) -> Optional[str]:
        return self._shape(ref, tier, field=field).tier if tier is not None else None

    def _check_head_tier(self, ref: ClusterRef, tier: Optional[str], field: str) -> None:
        self.catalog.resolve(tier, ref.kind, field=field)

    def _wait_started(
        self,
        record: ClusterRecord,
        started: List[WorkerRecord],
        replicas: int,
        timeout: float,
        progress: Optional[ProgressReporter],
    ) -> ClusterState:
        """Wait until the head sees ``replicas`` workers; fail fast if a new worker or the head exits. Each
        poll reads the record again (no lock held): a change made meanwhile is what is observed."""

        def read() -> ClusterState:
            current = self.store.load(record.ref) or record
            state = self.supervisor.observe(current)
            self.supervisor.check_started(current, started, state)
            return state

        return self._poll(read, record.ref, replicas, timeout, progress)

    def _poll(
        self,
        read: Callable[[], ClusterState],
        ref: ClusterRef,
        replicas: int,
        timeout: float,
        progress: Optional[ProgressReporter],
    ) -> ClusterState:
        awaited = Awaited(
            f"{plural(replicas, 'worker')} seen by the {self.driver(ref).head_label} of {ref}",
            replicas,
            lambda s: s.ready_workers or 0,
            lambda s: bool(s.head_ready) and (s.workers_up(replicas) or _superseded_and_up(s, replicas)),
        )
        return poll_until(read, awaited, timeout, progress, Pacing(_POLL))

    def _observe_or_absent(self, ref: ClusterRef) -> ClusterState:
        record = self.store.load(ref)
        return self.supervisor.observe(record) if record is not None else _absent(ref)

    def _down_locked(self, ref: ClusterRef, record: Optional[ClusterRecord]) -> ScaleResult:
        """Stop and forget a cluster (its baseline is already gone) for a caller holding its lock."""
        previous = self.supervisor.observe(record) if record is not None else _absent(ref)
        self.supervisor.take_down(record, ref)
        return _downed(ref, previous)

    def _whole(self, record: ClusterRecord, operation: str) -> ClusterRecord:
        """``record`` if no change was interrupted half-way through it, else :class:`InterruptedChangeError`:
        its size would be one nobody asked for."""
        pending = record.pending
        if pending is None:
            return record
        ref = record.ref
        cluster = f"--kind {ref.kind} --name {ref.name}"
        raise InterruptedChangeError(
            f"a change to {plural(pending.desired, 'worker')} by {pending.holder} (since {pending.since}) was "
            f"interrupted half-way and left {self.store.record_path(ref)} half-written ({plural(len(record.workers), 'worker')} "
            f"recorded, {record.desired} before the change); {operation} starts and stops nothing on it. Set the size "
            f"with `ddlscale local up {cluster} --replicas N` (it stops processes the record does not hold), or "
            f"`ddlscale local down {cluster}`",
            path=self.store.record_path(ref),
            cluster=str(ref),
        )

    def _load(self, ref: ClusterRef) -> ClusterRecord:
        record = self.store.load(ref)
        if record is None:
            raise ClusterNotFoundError(
                f"no local cluster {ref} in {self.store.root}; create it with "
                f"`ddlscale local up --kind {ref.kind} --name {ref.name}`",
                cluster=str(ref),
            )
        return record

    def _shape(self, ref: ClusterRef, tier_name: Optional[str], field: str) -> WorkerShape:
        name = tier_name if tier_name is not None else default_tier_name(self.catalog)
        tier = self.catalog.resolve(name, ref.kind, field=field)
        assert tier is not None
        return WorkerShape.from_tier(tier)

    def _served(self, ref: ClusterRef) -> ClusterRef:
        """Also loads the kind's driver, so a framework that is not installed is refused (with what
        to install) before anything is recorded or started."""
        super()._served(ref)
        self.driver(ref)
        return ref

    def _unserved(self, ref: ClusterRef) -> str:
        return (
            f"the local backend runs {served_frameworks()} clusters, not {ref.kind} ({ref}); use the "
            f"{'scaler or kubernetes backend' if ref.info.served_by_scaler else 'kubernetes backend'} for {ref.kind}"
        )


def _superseded_and_up(state: ClusterState, replicas: int) -> bool:
    """A wait for ``replicas`` workers is over when a later change (another phase) set more and at least
    ``replicas`` of them are up: what this change asked for is there."""
    return state.desired_workers > replicas and (state.ready_workers or 0) >= replicas


def _absent(ref: ClusterRef) -> ClusterState:
    """The state of a local cluster that does not exist (before first use, after ``down``)."""
    return ClusterState(
        cluster=str(ref), status=STOPPED, desired_workers=0, existing_workers=0, ready_workers=0, head_ready=False
    )


def _unchanged(state: ClusterState, requested: Optional[int] = None) -> ScaleResult:
    wanted = state.desired_workers if requested is None else requested
    return ScaleResult.sent(state.cluster, state, wanted, state.desired_workers, capped=False)


def _downed(ref: ClusterRef, previous: ClusterState) -> ScaleResult:
    return ScaleResult.sent(str(ref), previous, 0, 0, final=_absent(ref))
