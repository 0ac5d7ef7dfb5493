"""The backend contract: :class:`ClusterBackend`, whose public methods are done here once.

Nodes, phases, the connector and the CLI speak only this class, so the scaler
service, Kubernetes and local backends are interchangeable behind them; a
backend fills the hooks the class's docstring lists, in the order they are called.
"""
import abc
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterator, Optional, Tuple, Union

from ..errors import InvalidInputError, ScalingError, ScalingTimeoutError, UnsupportedOperationError, WorkerFailedError
from ._support.inplace import Reach, check_reachable, left_in_place
from ..models import Baseline, ClusterState, ReplicaSpec, RestartResult, ScaleResult, utcnow
from .._core.lifetime import Closing
from .._core.outage import no_wait_limit
from .._core.progress import ProgressReporter, seconds
from .._core.redaction import install_redaction
from .._core.leases import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS, split_live
from .._core.records import Claim
from ..refs import ClusterRef
from .._core.validation import validate_claim_id, validate_replicas, validate_tier_name, validate_timeout
from .._core.waiting import Deadline, ReadBudget, within

logger = logging.getLogger("flytekitplugins_ddlscale")

DEFAULT_SCALE_TIMEOUT = 900.0
"""Seconds a scale waits for workers by default: GPU nodes can take minutes to join."""
SPENT_BEFORE_WAIT = 0.5
"""Seconds spent before a wait from which its timeout error says the wait had only what was left."""
DEFAULT_RESTART_TIMEOUT = 600.0
"""Seconds a head restart waits for the new head by default."""


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend can do, so callers adapt instead of guessing: the one declaration every backend
    makes. The defaults are those of a backend that owns its cluster's size and records; a backend
    declares only where it differs."""

    kinds: FrozenSet[str]
    """Short kinds it serves (keys of ``refs.KINDS``)."""
    observes_readiness: bool = True
    """``ClusterState.ready_workers`` is real pod readiness."""
    holds_size: bool = True
    """A scale also holds the size against the cluster's autoscaler."""
    head_tier: bool = False
    """``restart_head(head_hw_tier=...)`` can change the head's tier."""
    persistent_baseline: bool = True
    """The baseline outlives this process (stored with the cluster or in shared files)."""
    observes_restarts: bool = False
    """``head_restarted`` tells a head ``restart_head(wait=False)`` brought up from the old one (the
    connector serves ``RestartHead`` only then)."""
    repairs_processes: bool = False
    """A ``reconcile`` also restarts a dead head and replaces dead workers (else the operator does)."""
    counts_registered_workers: bool = False
    """The backend's wait already counts workers registered with the framework."""
    reads_locally: bool = False
    """Reading a cluster touches only this machine, so a Ctrl-C report may read it."""
    creates_clusters: bool = False
    """A scale or claim of a missing cluster creates it (the CLI then refuses one unless asked)."""


@dataclass(frozen=True)
class SharedReads:
    """How a long-lived service's read (a connector's poll) may share what this process reads for its
    other reads: given to :meth:`ClusterBackend.get_state`, :meth:`~ClusterBackend.head_restarted` and
    :meth:`~ClusterBackend.cached_state`. A read without it is the caller's own."""

    linger: float = 60.0
    """Seconds a shared watch started for the read is kept after it."""
    max_age: float = 1.0
    """Age (seconds) of a shared poll result the read may reuse."""
    budget: Optional[float] = None
    """Seconds a read that goes to the backend may take, then a transient error; None: its own timeouts."""
    not_before: Optional[float] = None
    """Epoch seconds: a shared poll result begun earlier is not reused (a change was sent then)."""

    def deadline(self) -> Optional[Deadline]:
        """A :class:`ReadBudget` of :attr:`budget` seconds from now, or None without a budget."""
        return ReadBudget(self.budget) if self.budget is not None else None


def _operation_deadline(timeout: float, wait: bool) -> Deadline:
    """The deadline of an operation: its ``timeout``, or without ``wait`` at most
    :func:`~flytekitplugins_ddlscale._core.outage.no_wait_limit` (the time it rides out an outage)."""
    return Deadline(timeout if wait else min(timeout, no_wait_limit()))


@dataclass
class Change:
    """A change a backend has sent or made, before the wait for its workers: ``result`` (``final`` is
    the state right after it), whether it is ``restoring`` a baseline or target, and the ``detail``
    the backend's own wait needs (the tier id new workers carry, the processes just started)."""

    result: ScaleResult
    restoring: bool = False
    detail: Any = None
    needed: Optional[int] = None
    """How many of its workers the caller waits for (None: all; a phase's reconcile waits for its claim)."""


@dataclass(frozen=True)
class WorkersWait:
    """A wait for workers, as a backend's ``_wait_workers`` hook gets it."""

    replicas: int
    """How many workers to wait for."""
    timeout: float
    """Seconds the wait may take."""
    progress: Optional[ProgressReporter] = None
    change: Optional[Change] = None
    """The change the wait follows (None: a plain ``wait_for_workers``)."""
    last: Optional[ClusterState] = None
    """The latest state seen before the wait (None: none could be read)."""


class ClusterBackend(Closing, abc.ABC):
    """One way to read and resize clusters. The public methods are done here once: each checks its
    arguments before anything is sent (:class:`InvalidInputError` naming the field,
    :class:`UnsupportedOperationError` for a kind not served), refuses a wait that could never end,
    and turns a failed wait into an error naming what was left in place and the command that undoes
    it. Backends do not override them.

    The contract a backend fills, in the order the methods call it (* has a default here;
    docs/backends.md says what each must do):

    1. ``_observe`` (``get_state``; ``_shared_state``* with shared reads, ``cached_state``*);
       ``_observe_for_wait`` (the start of ``wait_for_workers``);
    2. a change: ``_changing``* around ``_scale_change``, ``_restore_change`` or
       ``_reconcile_change`` (:class:`FileRecordsBackend` makes them from its own hooks);
    3. its wait: ``_wait_workers``, then ``_settled``*; a failed wait calls ``_wait_failed``* and
       ``_reach`` (the remedy); without ``wait``, ``_unwaited``*;
    4. ``_restart_head``; ``_head_restarted``* (only with ``capabilities.observes_restarts``);
    5. the records: ``_record_baseline``, ``_get_baseline``, ``_claim``, ``_renew``, ``_release``,
       ``_claims``, ``_recorded_claims`` (:class:`FileRecordsBackend` keeps them in files);
    6. what input checks and errors ask: ``_check_tier``*, ``_check_head_tier``*, ``_same_tier``*,
       ``_maximum``*, ``_size_setting``*, ``_unserved``*; and ``close``*, ``connection_env``*.
    """

    name: str = "base"
    capabilities: BackendCapabilities
    size_setting = "spec.worker.replicas"
    """What holds a cluster's size, as errors name it (left in place, unreachable waits)."""
    maximum_setting = "maxReplicas"
    """What bounds a cluster's size, as errors name it."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "ClusterBackend":
        # Here rather than on import: flytekit imports the plugin into every process it starts, and only
        # one that uses a backend has credentials of ours to keep out of its logs.
        install_redaction()
        return super().__new__(cls)

    @classmethod
    def stop_command(cls, ref: ClusterRef) -> str:
        """The ``ddlscale restore`` a user runs to put ``ref`` back (an interrupted flow's report names it)."""
        namespace = f" --namespace {ref.namespace}" if ref.namespace else ""
        group = f" --group {ref.group}" if ref.group is not None else ""
        return f"ddlscale restore --backend {cls.name} --kind {ref.kind} --name {ref.name}{namespace}{group}"

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Release connections and background threads (nothing by default)."""

    def connection_env(self, ref: ClusterRef) -> Dict[str, str]:
        """The variables code in a run uses to reach ``ref``'s head, as Domino injects them (empty by
        default: on Domino the platform injects them itself)."""
        self._served(ref)
        return {}

    # ------------------------------------------------------- public methods

    def get_state(self, ref: ClusterRef, reads: Optional[SharedReads] = None) -> ClusterState:
        """Observe the cluster now; with ``reads``, from what this process shares where it answers."""
        ref = self._served(ref)
        return self._observe(ref) if reads is None else self._shared_state(ref, reads)

    def cached_state(self, ref: ClusterRef, reads: SharedReads) -> Optional[ClusterState]:
        """The cluster from what this process already shares alone, at once (no request, no wait, nothing
        started): None where that cannot answer, and the caller reads with :meth:`get_state`. None by
        default; a backend whose shared reads answer from memory overrides it."""
        self._served(ref)
        return None

    def wait_for_workers(
        self, ref: ClusterRef, replicas: int, *, timeout: float = DEFAULT_SCALE_TIMEOUT,
        progress: Optional[ProgressReporter] = None,
    ) -> ClusterState:
        """Return once ``replicas`` workers are up (at least that many while the cluster wants more);
        ``ScalingTimeoutError`` at ``timeout``; ``UnreachableWaitError`` at once for more than the
        cluster wants or can have."""
        replicas = validate_replicas(replicas)
        timeout = validate_timeout(timeout)
        self._served(ref)
        deadline = Deadline(timeout)
        state = self._observe_for_wait(ref, replicas, deadline)
        if state is not None:
            check_reachable(
                replicas, desired=state.desired_workers, maximum=self._maximum(state), cluster=state.cluster,
                desired_name=self._size_setting(ref), maximum_name=self.maximum_setting, state=state,
            )
        return self._wait_workers(ref, WorkersWait(replicas, deadline.remaining, progress, last=state))

    def scale(
        self, ref: ClusterRef, replicas: int, worker_hw_tier: Optional[str] = None, *, wait: bool = True,
        timeout: float = DEFAULT_SCALE_TIMEOUT, strict: bool = False, progress: Optional[ProgressReporter] = None,
    ) -> ScaleResult:
        """Set the worker count (and tier), recording the baseline first if none is; with ``wait``,
        return once they are up. ``strict`` refuses a request above the maximum instead of capping it.
        A failed wait leaves the change in place and its error names the command that restores."""
        replicas, tier, deadline = self._check_size_request(ref, replicas, worker_hw_tier, timeout, wait)
        with self._changing(ref, deadline):
            change = self._scale_change(ref, replicas, tier, strict, deadline)
        return self._finish(ref, change, wait, deadline, progress)

    def restart_head(
        self, ref: ClusterRef, head_hw_tier: Optional[str] = None, *, wait: bool = True,
        timeout: float = DEFAULT_RESTART_TIMEOUT, progress: Optional[ProgressReporter] = None,
    ) -> RestartResult:
        """Replace the head pod (on a new tier if given); with ``wait``, until it is Ready."""
        tier = validate_tier_name(head_hw_tier, field="head_hw_tier")
        timeout = validate_timeout(timeout)
        self._served(ref)
        return self._restart_head(ref, tier, wait, _operation_deadline(timeout, wait), progress)

    def head_restarted(
        self, ref: ClusterRef, restart: RestartResult, reads: Optional[SharedReads] = None
    ) -> Tuple[bool, ClusterState]:
        """One look (no wait, nothing sent) at a restart ``restart_head(wait=False)`` returned, for a caller
        that cannot block (the connector): whether the new head is Ready, and the cluster now (as
        :meth:`get_state` reads it). :class:`UnsupportedOperationError` unless ``capabilities.observes_restarts``."""
        self._served(ref)
        if not self.capabilities.observes_restarts:
            raise UnsupportedOperationError(
                f"the {self.name} backend cannot tell a restarted head from the old one after the restart",
                cluster=str(ref),
            )
        return self._head_restarted(ref, restart, reads)

    def version_seen(self, ref: ClusterRef) -> str:
        """The version of ``ref``'s object this process last wrote or read ('' where the backend keeps
        none), for another process (a connector replica) to pass to :meth:`expect_version`."""
        self._served(ref)
        return ""

    def expect_version(self, ref: ClusterRef, version: str) -> None:
        """Answer reads of ``ref`` from a cache only once it holds ``version`` (another process's
        :meth:`version_seen`) or later; until then they go to the server. Nothing by default."""
        self._served(ref)

    def in_place_error(
        self, ref: ClusterRef, error: ScalingError, desired: int, *, restoring: bool, found: Optional[int] = None
    ) -> ScalingError:
        """``error`` of a failed wait for ``desired`` workers after a change of ``ref``, extended with
        what the change left in place (``found``: the size read after it, when it differs) and the
        command that undoes it (after a restore: keeps waiting)."""
        return left_in_place(
            error, self._reach(ref), self._size_setting(ref), desired, restoring=restoring, found=found
        )

    def record_baseline(self, ref: ClusterRef) -> Baseline:
        """Record the cluster's current size and tiers unless already recorded; return the baseline."""
        return self._record_baseline(self._served(ref))

    def get_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        """The recorded baseline, or None."""
        return self._get_baseline(self._served(ref))

    def restore_baseline(
        self, ref: ClusterRef, target: Optional[ReplicaSpec] = None, *, wait: bool = True,
        timeout: float = DEFAULT_SCALE_TIMEOUT, progress: Optional[ProgressReporter] = None,
    ) -> ScaleResult:
        """Put the cluster back to the recorded baseline (or ``target``), then forget the baseline and
        every claim (claims of killed processes would otherwise inflate the next phase)."""
        deadline = self._check_restore_request(ref, target, timeout, wait)
        with self._changing(ref, deadline):
            change = self._restore_change(ref, target, deadline)
        return self._finish(ref, change, wait, deadline, progress)

    def claim(
        self, ref: ClusterRef, claim_id: str, replicas: int, worker_hw_tier: Optional[str] = None, *,
        timeout: Optional[float] = None, lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> Claim:
        """Register that ``claim_id`` needs at least ``replicas`` workers (a lease of ``lease_seconds`` kept
        with :meth:`renew`); the largest live claim. In the same atomic step dead claims are dropped and the
        baseline (with no other live claim, the size outside phases) recorded, so a concurrent :meth:`reconcile`
        never forgets what it relies on. ``timeout``: longest wait for another's lock (None: the backend's)."""
        validate_claim_id(claim_id)
        replicas = validate_replicas(replicas)
        tier = validate_tier_name(worker_hw_tier)
        lease = validate_timeout(lease_seconds, "lease_seconds", MAX_LEASE_SECONDS)
        wait_for_lock = None if timeout is None else validate_timeout(timeout)
        self._served(ref)
        tier = self._check_tier(ref, tier, "worker_hw_tier")
        return self._claim(ref, claim_id, replicas, tier, lease, wait_for_lock)

    def renew(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Renew ``claim_id``'s lease from now; the renewed claim, or None when it is gone."""
        validate_claim_id(claim_id)
        return self._renew(self._served(ref), claim_id)

    def reconcile(
        self, ref: ClusterRef, target: Optional[ReplicaSpec] = None, *, wait: bool = True,
        timeout: float = DEFAULT_SCALE_TIMEOUT, progress: Optional[ProgressReporter] = None,
        needed: Optional[int] = None,
    ) -> Optional[ScaleResult]:
        """Hold the largest live claim (or the size outside phases when larger on its tier), else restore
        the size outside phases (or ``target``) and forget it (``_core.claimrules.settle``); None when there
        was nothing to do. Dead claims are dropped; deciding and changing is atomic against :meth:`claim`
        and :meth:`release`; the wait holds no lock and ends once ``needed`` workers (default: all) are up."""
        if needed is not None:
            needed = validate_replicas(needed, "needed")
        deadline = self._check_restore_request(ref, target, timeout, wait)
        with self._changing(ref, deadline):
            change = self._reconcile_change(ref, target, deadline)
        if isinstance(change, Change):
            change.needed = needed
        return None if change is None else self._finish(ref, change, wait, deadline, progress)

    def release(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Drop ``claim_id``; return the largest remaining claim, or None when none remain."""
        validate_claim_id(claim_id)
        return self._release(self._served(ref), claim_id)

    def claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """The live claims of ``ref`` by claim id (empty when none)."""
        return self._claims(self._served(ref))

    def dead_claims(self, ref: ClusterRef) -> Dict[str, Tuple[Claim, str]]:
        """The claims on ``ref``'s record that no longer count (holder gone, lease out), each with why."""
        return split_live(self._recorded_claims(self._served(ref)))[1]

    def give_back(self, ref: ClusterRef, timeout: float = DEFAULT_SCALE_TIMEOUT) -> Optional[ScaleResult]:
        """Give back what dead claims on ``ref``'s record held: a :meth:`reconcile`, not waited for.
        None when there were none (nothing is sent)."""
        timeout = validate_timeout(timeout)
        dead = self.dead_claims(ref)
        if not dead:
            return None
        result = self.reconcile(ref, wait=False, timeout=timeout)
        if result is not None:
            logger.warning(
                "%s: gave back what %s held: the cluster is set to %d workers",
                ref, ", ".join(sorted(dead)), result.effective,
            )
        return result

    # ------------------------------------------------------- done once here

    def _served(self, ref: ClusterRef) -> ClusterRef:
        """``ref``, after refusing what is not a :class:`ClusterRef` or a kind this backend does not serve."""
        if not isinstance(ref, ClusterRef):
            raise InvalidInputError("ref", ref, "a ClusterRef")
        if ref.kind not in self.capabilities.kinds:
            raise UnsupportedOperationError(self._unserved(ref), cluster=str(ref))
        return ref

    def _check_size_request(
        self, ref: ClusterRef, replicas: object, worker_hw_tier: Optional[str], timeout: object, wait: bool = True
    ) -> Tuple[int, Optional[str], Deadline]:
        """The checked worker count, tier name and the operation's deadline of a request to resize ``ref``."""
        count = validate_replicas(replicas)
        tier = validate_tier_name(worker_hw_tier)
        seconds = validate_timeout(timeout)
        self._served(ref)
        tier = self._check_tier(ref, tier, "worker_hw_tier")
        return count, tier, _operation_deadline(seconds, wait)

    def _check_restore_request(
        self, ref: ClusterRef, target: Optional[ReplicaSpec], timeout: object, wait: bool
    ) -> Deadline:
        """The deadline of a restore or reconcile of ``ref``, after refusing a bad ``target`` or ``timeout``."""
        seconds = validate_timeout(timeout)
        self._served(ref)
        deadline = _operation_deadline(seconds, wait)
        if target is None:
            return deadline
        if not isinstance(target, ReplicaSpec):
            raise InvalidInputError("target", target, "a ReplicaSpec or None")
        validate_replicas(target.replicas, field="target.replicas")
        self._check_tier(ref, validate_tier_name(target.worker_hw_tier, field="target.worker_hw_tier"),
                         "target.worker_hw_tier")
        self._check_head_tier(ref, validate_tier_name(target.head_hw_tier, field="target.head_hw_tier"),
                              "target.head_hw_tier")
        return deadline

    def _finish(
        self, ref: ClusterRef, change: Union[Change, ScaleResult], wait: bool, deadline: Deadline,
        progress: Optional[ProgressReporter], *, explain: bool = True,
    ) -> ScaleResult:
        """The result of ``change`` (a plain :class:`ScaleResult` had nothing to wait for); with ``wait``,
        once its workers are up. Every probe on the way gets at most what is left of ``deadline``."""
        with within(deadline):
            if isinstance(change, ScaleResult):
                return change
            result = change.result
            began = time.monotonic()
            if wait:
                final = self._wait_for_change(ref, change, deadline, progress, explain)
            else:
                final = self._unwaited(ref, change)
            result.final = self._settled(ref, change, final, wait)
            result.waited = wait
            result.seconds_waited = time.monotonic() - began if wait else 0.0
            return result

    def _wait_for_change(
        self, ref: ClusterRef, change: Change, deadline: Deadline, progress: Optional[ProgressReporter],
        explain: bool,
    ) -> ClusterState:
        """The state once ``change``'s workers are up. A wait that fails leaves the change in place
        (``explain``: the error names it and the remedy)."""
        result = change.result
        began_at = utcnow()
        before_wait = deadline.elapsed
        awaited = result.effective if change.needed is None else min(change.needed, result.effective)
        # A change that must bring workers up is not awaited past its timeout; one that only
        # stopped workers (a restore) has nothing left to wait for and reads the result once.
        spent = deadline.expired and awaited > (result.previous.ready_workers or 0)
        try:
            if spent:
                raise self._spent_before_wait(ref, change, deadline)
            wait = WorkersWait(awaited, deadline.left_for_wait(), progress, change, result.final)
            return self._wait_workers(ref, wait)
        except (ScalingTimeoutError, WorkerFailedError) as error:
            if isinstance(error, ScalingTimeoutError) and not spent and before_wait >= SPENT_BEFORE_WAIT:
                # The wait's own timeout was only what the change left of the operation's.
                error.message = (
                    f"{error.message} (the operation's timeout is {seconds(deadline.timeout)}; "
                    f"the change itself took {seconds(before_wait)} of it)"
                )
                error.args = (error.message,)
            self._wait_failed(ref, change)
            if not explain:
                raise
            # Only a state the wait read reports what the change left; one from before it does not.
            seen = error.state if error.state is not None and error.state.observed_at >= began_at else None
            raise self.in_place_error(
                ref, error, result.effective, restoring=change.restoring,
                found=seen.desired_workers if seen is not None else None,
            ) from None

    def _spent_before_wait(self, ref: ClusterRef, change: Change, deadline: Deadline) -> ScalingTimeoutError:
        """The timeout error of an operation whose change alone (creating a cluster, an outage ridden
        out) took its whole timeout before the workers it needs were up: they are not awaited past it."""
        state = self._unwaited(ref, change)
        return ScalingTimeoutError(
            f"the operation's timeout of {seconds(deadline.timeout)} ran out while the change was made "
            f"(it took {seconds(deadline.elapsed)}), before the wait for "
            f"{change.result.effective} workers; last state: {state.describe()}",
            cluster=str(ref),
            state=state,
        )

    # ------------------------------------------------------- backend hooks

    def _size_setting(self, ref: ClusterRef) -> str:
        """What holds ``ref``'s size, as errors name it (:attr:`size_setting` unless a kind says otherwise)."""
        return self.size_setting

    def check_kind(self, ref: ClusterRef, field: str = "kind") -> None:
        """:class:`InvalidInputError` naming ``field`` and the kinds served, for a kind not served (the
        CLI's answer; the methods raise :class:`UnsupportedOperationError`)."""
        if ref.kind not in self.capabilities.kinds:
            raise InvalidInputError(
                field, ref.kind, ", ".join(sorted(self.capabilities.kinds)), reason=self._unserved(ref)
            )

    def _unserved(self, ref: ClusterRef) -> str:
        """Why ``ref``'s kind is not served, and what serves it."""
        return (
            f"the {self.name} backend does not serve {ref.kind} clusters "
            f"(it serves {', '.join(sorted(self.capabilities.kinds))})"
        )

    def _check_tier(self, ref: ClusterRef, tier: Optional[str], field: str) -> Optional[str]:
        """``tier`` as the backend's catalog spells it, after refusing one it knows to be wrong (default:
        as given; the cluster judges it)."""
        return tier

    def _check_head_tier(self, ref: ClusterRef, tier: Optional[str], field: str) -> None:
        """Refuse a head tier this backend cannot set or knows to be wrong."""
        if tier is not None and not self.capabilities.head_tier:
            raise UnsupportedOperationError(
                f"the {self.name} backend cannot change the head's hardware tier; use the kubernetes backend",
                cluster=str(ref),
            )

    @contextlib.contextmanager
    def _changing(self, ref: ClusterRef, deadline: Deadline) -> Iterator[None]:
        """Held around a change, never its wait (default: nothing; the local backend holds its cluster lock)."""
        yield

    def _same_tier(self, ref: ClusterRef, name: str, observed: Optional[str]) -> bool:
        """Whether tier ``name`` is the tier ``observed`` on the cluster (a recorded size is a floor
        of a claim only on its own tier)."""
        return name == observed

    def _maximum(self, state: ClusterState) -> Optional[int]:
        """The most workers ``state``'s cluster can have (None: no bound known)."""
        return state.autoscaling_max

    def _unwaited(self, ref: ClusterRef, change: Change) -> ClusterState:
        """The state to report after a change not waited for."""
        return change.result.final

    def _wait_failed(self, ref: ClusterRef, change: Change) -> None:
        """Tidy up after the wait for ``change`` failed; the change itself stays."""

    def _settled(self, ref: ClusterRef, change: Change, final: ClusterState, waited: bool) -> ClusterState:
        """Finish ``change`` once its workers are up (or not waited for); return the state to report."""
        return final

    @abc.abstractmethod
    def _observe(self, ref: ClusterRef) -> ClusterState:
        """The cluster now."""

    def _shared_state(self, ref: ClusterRef, reads: SharedReads) -> ClusterState:
        """The cluster now, sharing reads as ``reads`` says (:meth:`_observe` by default)."""
        return self._observe(ref)

    @abc.abstractmethod
    def _observe_for_wait(self, ref: ClusterRef, replicas: int, deadline: Deadline) -> Optional[ClusterState]:
        """The cluster at the start of a wait, to refuse an impossible one; None when it cannot be read
        now but may be before ``deadline`` (the wait then rides out the outage)."""

    @abc.abstractmethod
    def _wait_workers(self, ref: ClusterRef, wait: WorkersWait) -> ClusterState:
        """Wait until ``wait.replicas`` workers are up (after ``wait.change``, if given)."""

    @abc.abstractmethod
    def _reach(self, ref: ClusterRef) -> Reach:
        """How ``ddlscale`` and a new process reach this cluster and its records (for remedies)."""

    @abc.abstractmethod
    def _scale_change(
        self, ref: ClusterRef, replicas: int, tier: Optional[str], strict: bool, deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        """Record the baseline if none is, then set ``replicas`` workers (and ``tier``)."""

    @abc.abstractmethod
    def _restore_change(
        self, ref: ClusterRef, target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        """Put back the baseline (or ``target``); forget the baseline and every claim."""

    @abc.abstractmethod
    def _reconcile_change(
        self, ref: ClusterRef, target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Union[Change, ScaleResult, None]:
        """Scale to the largest claim, else restore the baseline (or ``target``); None if neither exists."""

    @abc.abstractmethod
    def _restart_head(
        self, ref: ClusterRef, tier: Optional[str], wait: bool, deadline: Deadline,
        progress: Optional[ProgressReporter],
    ) -> RestartResult:
        """Replace the head (on ``tier`` if given); with ``wait``, until the new head is Ready."""

    def _head_restarted(
        self, ref: ClusterRef, restart: RestartResult, reads: Optional[SharedReads]
    ) -> Tuple[bool, ClusterState]:
        """Whether the head ``restart`` asked for is up and Ready (optional: only with ``observes_restarts``)."""
        raise NotImplementedError(f"{type(self).__name__} declares observes_restarts without _head_restarted")

    @abc.abstractmethod
    def _record_baseline(self, ref: ClusterRef) -> Baseline:
        """Record ``ref``'s size and tiers now unless a baseline is recorded; the baseline recorded."""

    @abc.abstractmethod
    def _get_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        """The recorded baseline, or None; only reads."""

    @abc.abstractmethod
    def _claim(
        self, ref: ClusterRef, claim_id: str, replicas: int, tier: Optional[str], lease_seconds: float,
        timeout: Optional[float],
    ) -> Claim:
        """Store the claim as a lease (dead claims dropped, the baseline and the size outside phases
        recorded in the same atomic step); the largest live claim. ``timeout``: longest wait for a lock."""

    @abc.abstractmethod
    def _renew(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Renew ``claim_id``'s lease from now, keeping when it was made; None when it is gone."""

    @abc.abstractmethod
    def _release(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Drop ``claim_id``; the largest remaining live claim, or None."""

    @abc.abstractmethod
    def _claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """The live claims by id; only reads."""

    @abc.abstractmethod
    def _recorded_claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """Every claim on ``ref``'s record, live or dead."""


BaseBackend = ClusterBackend
"""The same class under its earlier name (the base class beside a separate protocol, now one)."""
