"""The one background thread of a phase: renews its claim, samples the cluster, holds its size, watches for faults.

From the claim on it renews the claim's lease (:mod:`..leases`) every third of
the lease, so a long scale-up wait never lets the claim lapse, and a phase
that stops renewing (killed, hung) loses it. A renewal that fails (an
outage) is logged and tried again at the next tick. The holder times itself
with a :class:`~..leases.HolderClock` checked every second
(:data:`STALL_CHECK`), so a process that was stopped (SIGSTOP, a debugger) or
suspended renews as soon as it runs again, not at its next scheduled renewal.
A claim found gone is a fault (below): one that lapsed because its holder
could not renew it within its lease (the clock says so) is claimed again and
the cluster brought back to its size; one dropped while its holder renewed
on time (``ddlscale restore`` ends every phase) is reported and never
re-added.

Once the body runs (:meth:`PhaseMonitor.watch`) it also samples the
cluster for the Deck; re-asserts the claim where the backend cannot hold the
size against the autoscaler (``capabilities.holds_size`` False; through the
atomic ``reconcile``); and watches for faults (:mod:`.faults`): a head that
stopped answering, fewer workers up than the body needs (for any reason:
workers lost, or the cluster scaled below the phase's claim) or the phase's
claim lost is logged at once and, where the backend repairs its own
processes (``capabilities.repairs_processes``: the local backend restarts
the head on its port and replaces lost workers), repaired through a
reconcile; a size scaled below the claim is re-asserted (a reconcile) on
every backend, after claiming again a claim that lapsed; elsewhere the
cluster's operator repairs it and the phase reports it. With
``fail_on_fault`` the phase's ``on_fault`` callback is called instead of
repairing, to stop the body.

One lock is held while a call that changes records is in flight, so
:meth:`PhaseMonitor.stop` makes sure none runs (and none starts) before the
phase releases its claim.
"""
import logging
import threading
import time
from typing import Callable, List, Optional

from ...backends._base import ClusterBackend
from ...errors import ClusterNotFoundError
from ..._core.leases import ClockReading, HolderClock, read_clocks, renew_interval
from ..._core.claimrules import largest_claim
from ...refs import ClusterRef
from ..._core.timeline import WorkerTimeline, observed_workers
from .faults import FAILED, NOT_RECLAIMED, REASSERTED, RECLAIMED, REPAIRED, REPORTED, Fault, find_fault, head_name

logger = logging.getLogger("flytekitplugins_ddlscale")


REASSERT_TIMEOUT = 20.0
"""Seconds one re-assert or repair request may take, riding out an outage included: shorter than
:meth:`PhaseMonitor.stop` waits, so it never outlives the phase's body (the next tick tries again)."""
STALL_CHECK = 1.0
"""Longest the monitor sleeps between looks at its :class:`HolderClock` (no request is sent): a holder
stopped or suspended past its renewal renews within this of running again."""


class PhaseMonitor:
    """Renews ``claim_id`` from :meth:`start`; samples, re-asserts and watches for faults from :meth:`watch`."""

    def __init__(
        self,
        backend: ClusterBackend,
        ref: ClusterRef,
        claim_id: str,
        lease_seconds: float,
        timeline: WorkerTimeline,
        *,
        worker_hw_tier: Optional[str] = None,
        sample_interval: float = 5.0,
        fail_on_fault: bool = False,
        on_fault: Optional[Callable[[Fault], None]] = None,
        clock: Callable[[], float] = time.monotonic,
        replicas: Optional[int] = None,
        claimed_at: Optional[ClockReading] = None,
    ) -> None:
        self._backend = backend
        self._ref = ref
        self._claim_id = claim_id
        self._replicas = replicas
        """What the claim asks for, to claim again after it lapsed (None: never claim again)."""
        self._lease = lease_seconds
        self._held = HolderClock(claimed_at)
        """Time since the claim was last made or renewed (counted from when that request was sent, a
        :func:`read_clocks` reading passed as ``claimed_at`` for the claim; None: now), as this process
        can tell after a stop."""
        self._renew_every = renew_interval(lease_seconds)
        self._timeline = timeline
        self._tier = worker_hw_tier
        self._sample_interval = sample_interval
        self._fail_on_fault = fail_on_fault
        self._on_fault = on_fault
        self._clock = clock
        self._began = clock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        """Set by :meth:`watch` and :meth:`stop`, so the loop does not sleep out a long renewal interval."""
        self._in_flight = threading.Lock()
        self._needed: Optional[int] = None
        self._reassert_interval: Optional[float] = None
        self._thread = threading.Thread(target=self._run, name=f"ddlscale-phase-{ref.name}", daemon=True)
        self.lost: Optional[str] = None
        """Why the claim is gone from the record, while it is (a lapsed claim claimed again clears it)."""
        self._reclaim = False
        """Whether a lapsed claim is still to be claimed again (a claim that failed is tried again)."""
        self.pullbacks = 0
        """How many times the size was found pulled back and re-asserted."""
        self.faults: List[Fault] = []
        """Every fault seen while the body ran, in order (the last may still last)."""
        self.failed: Optional[Fault] = None
        """With ``fail_on_fault``: the fault that failed the phase."""

    def start(self) -> None:
        """Start the thread: lease renewals from now on."""
        self._thread.start()

    def watch(self, needed: int, reassert_interval: Optional[float]) -> None:
        """From now on also sample the cluster, re-assert every ``reassert_interval`` s (None: never),
        and treat fewer than ``needed`` workers or a lost head as a fault."""
        self._reassert_interval = reassert_interval
        self._needed = needed
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread and wait (at most ``timeout`` seconds) for a call in flight to finish.

        Once this returns, no renewal, re-assert or repair can start any more;
        one still in flight after ``timeout`` (a hanging backend) is logged.
        A fault still open is closed as "not whole again by the end".
        """
        self._stop.set()
        self._wake.set()
        if self._in_flight.acquire(timeout=timeout):
            self._in_flight.release()
        else:
            logger.warning("phase monitor of %s: a call is still in flight after %.0fs", self._ref, timeout)
        self._thread.join(timeout)

    # ------------------------------------------------------------ the loop

    def _elapsed(self) -> float:
        return self._clock() - self._began

    def _run(self) -> None:
        now = self._clock()
        next_renewal = now + self._renew_every
        next_sample = now
        next_reassert: Optional[float] = None
        while True:
            self._wake.wait(self._tick())
            self._wake.clear()
            if self._stop.is_set():
                return
            now = self._clock()
            # The holder's own clock also counts time this process did not run (stopped, suspended).
            due = now >= next_renewal or self._held.since() >= self._renew_every
            if due and (self.lost is None or self._reclaim):
                next_renewal = now + self._renew_every
                if not self._locked(self._renew if self.lost is None else self._claim_again):
                    return
            needed = self._needed
            if needed is None or now < next_sample:
                continue
            next_sample = now + self._sample_interval
            if self._reassert_interval is not None and next_reassert is None:
                next_reassert = now + self._reassert_interval
            reassert = next_reassert is not None and now >= next_reassert
            if reassert and self._reassert_interval is not None:
                next_reassert = now + self._reassert_interval
            if not self._locked(lambda: self._sample(needed, reassert)):
                return

    def _tick(self) -> float:
        tick = min(self._renew_every, STALL_CHECK)
        if self._needed is not None:
            tick = min(tick, self._sample_interval, self._reassert_interval or tick)
        return tick

    def _locked(self, call: Callable[[], None]) -> bool:
        """Run ``call`` holding the in-flight lock; False once the phase has ended (nothing run)."""
        with self._in_flight:
            # The phase may have ended meanwhile: a claim renewed, re-added or repaired after its
            # release would hold the cluster up.
            if self._stop.is_set():
                return False
            try:
                call()
            except Exception as exc:  # an outage or a hiccup must not end the body: the next tick tries again
                logger.warning("phase monitor of %s: %s", self._ref, exc)
            return True

    # ----------------------------------------------------------- each job

    def _renew(self) -> None:
        sent = read_clocks()
        if self._backend.renew(self._ref, self._claim_id) is not None:
            self._held.mark(sent)
            return
        # Counted once the answer is in: a renewal that took long (an outage ridden out) may have let
        # the claim lapse meanwhile.
        self._claim_lost(self._held.since())

    def _claim_lost(self, late: float) -> None:
        """The claim is gone from the record, ``late`` seconds after it was last made or renewed: a fault
        during the body; claimed again (and the size re-asserted) when it lapsed, unless the phase fails."""
        lapsed = late >= self._lease
        if lapsed:
            self.lost = (
                f"the claim of phase {self._claim_id} on {self._ref} lapsed: this process did not run or could "
                f"not renew it for {late:.0f} s, past its lease of {self._lease:g} s, and it was dropped"
            )
        else:
            self.lost = (
                f"the claim of phase {self._claim_id} on {self._ref} was dropped from the record while it was "
                "renewed on time (`ddlscale restore` ends every phase)"
            )
        already_open = self._fault_open()
        if self._needed is not None:
            self._fault_seen(self.lost, repairable=False, record_only=True)  # logs a new fault
        if self._needed is None or already_open:
            logger.error("phase %s: %s; the cluster no longer holds workers for it", self._claim_id, self.lost)
        if self.failed is not None:
            return
        if not lapsed or self._replicas is None:
            fault = self._open_fault()
            if fault is not None:
                fault.action = NOT_RECLAIMED
            return
        self._reclaim = True
        self._claim_again()

    def _claim_again(self) -> None:
        """Claim the lapsed claim again and bring the cluster back to its size; a claim that fails (an
        outage) is tried again at the next renewal tick."""
        assert self._replicas is not None
        sent = read_clocks()
        self._backend.claim(
            self._ref, self._claim_id, self._replicas, self._tier, timeout=REASSERT_TIMEOUT, lease_seconds=self._lease
        )
        self._held.mark(sent)
        self.lost, self._reclaim = None, False
        logger.warning(
            "phase %s: claimed %s again (at least %d workers); bringing the cluster back to its size",
            self._claim_id, self._ref, self._replicas,
        )
        fault = self._open_fault()
        if fault is not None:
            fault.action = RECLAIMED
        self._backend.reconcile(self._ref, wait=False, timeout=REASSERT_TIMEOUT)

    def _open_fault(self) -> Optional[Fault]:
        """The fault of the body still open, or None (none open, or the body not yet running)."""
        return self.faults[-1] if self._needed is not None and self._fault_open() else None

    def _sample(self, needed: int, reassert: bool) -> None:
        try:
            state = self._backend.get_state(self._ref)
        except ClusterNotFoundError as gone:
            self._fault_seen(f"{self._ref} is gone ({gone.message})", repairable=False)
            return
        self._timeline.add(observed_workers(state), state.worker_hw_tier or self._tier)
        problem = find_fault(state, needed, head_name(self._ref.kind))
        if problem is not None and not self._fault_open():
            # A second look before a new fault counts: one slow answer of a busy head is not a fault.
            problem = find_fault(self._backend.get_state(self._ref), needed, head_name(self._ref.kind))
        pulled_back = problem is not None and state.desired_workers < needed
        if problem is not None:
            self._fault_seen(problem, repairable=True, pulled_back=pulled_back)
        else:
            self._fault_cleared()
        if reassert and self.lost is None and self.failed is None:
            self._reassert(state.desired_workers, reconciled=pulled_back)

    def _fault_open(self) -> bool:
        return bool(self.faults) and self.faults[-1].ended is None

    def _fault_seen(
        self, problem: str, repairable: bool, pulled_back: bool = False, record_only: bool = False
    ) -> None:
        """Record ``problem`` (a new fault unless one is open), fail the phase with ``fail_on_fault``, else
        repair: a size ``pulled_back`` below the claim is re-asserted on every backend, lost processes
        are replaced where the backend repairs them. ``record_only``: the caller repairs."""
        fault = self.faults[-1] if self._fault_open() else None
        if fault is None:
            fault = Fault(problem, self._elapsed())
            self.faults.append(fault)
            self._timeline.mark("fault")
            logger.error("phase %s: %s", self._claim_id, problem)
            if self._fail_on_fault:
                fault.action = FAILED
                self.failed = fault
                logger.error("phase %s: failing the phase (fail_on_fault)", self._claim_id)
                if self._on_fault is not None:
                    self._on_fault(fault)
        if self.failed is not None or record_only:
            return
        if pulled_back:
            self._hold_size(fault)
            return
        if not repairable or not self._backend.capabilities.repairs_processes:
            if fault.action not in (RECLAIMED, REASSERTED):
                fault.action = REPORTED
            return
        if self.lost is not None:
            return  # the phase no longer holds the cluster: not its to repair
        if not fault.action:
            logger.warning("phase %s: repairing %s", self._claim_id, self._ref)
        if fault.action not in (RECLAIMED, REASSERTED):
            fault.action = REPAIRED
        # A reconcile decides from the claims live now, so it never shrinks another phase; it
        # restarts a lost head on its port and replaces lost workers. Repeated while the fault
        # lasts: processes already started are counted, so a repeat starts nothing twice.
        self._backend.reconcile(self._ref, wait=False, timeout=REASSERT_TIMEOUT)

    def _hold_size(self, fault: Fault) -> None:
        """The cluster was scaled below this phase's need: re-assert its claim (a reconcile decides from
        the claims live now, so no other phase shrinks), after claiming again one that lapsed."""
        if self.lost is not None:
            return  # dropped on time: reported, never re-added
        if self._claim_id not in self._backend.claims(self._ref):
            self._claim_lost(self._held.since())
            return
        if fault.action not in (RECLAIMED, REASSERTED):
            logger.warning("phase %s: re-asserting its claim on %s", self._claim_id, self._ref)
            fault.action = REASSERTED
        self._backend.reconcile(self._ref, wait=False, timeout=REASSERT_TIMEOUT)

    def _fault_cleared(self) -> None:
        if self._fault_open():
            fault = self.faults[-1]
            fault.ended = self._elapsed()
            logger.warning(
                "phase %s: %s is whole again after %.1f s", self._claim_id, self._ref, fault.ended - fault.began
            )

    def _reassert(self, desired: int, reconciled: bool) -> None:
        # Never a re-claim: a claim `ddlscale restore` dropped stays dropped. The reconcile decides
        # from the claims live at its own moment, so a concurrent larger phase is never shrunk.
        # ``reconciled``: the fault this sample found already re-asserted the size; a second reconcile
        # right after it may read the size from before the first (a shared or lagging read) and send
        # the same scale again.
        claims = self._backend.claims(self._ref)
        if self._claim_id not in claims:
            logger.warning("phase %s: its claim on %s is gone; not re-asserting", self._claim_id, self._ref)
            return
        claim = largest_claim(claims)
        if claim is None or desired >= claim.replicas:
            return
        if self._tier is not None and claim.worker_hw_tier != self._tier:
            # A larger claim of another tier is live (a phase about to be refused
            # for it): adopting it would replace this body's workers mid-run.
            logger.warning(
                "not re-asserting %s: the largest claim (%s) asks for tier %r, this phase runs on %r",
                self._ref, claim.claim_id, claim.worker_hw_tier, self._tier,
            )
            return
        self.pullbacks += 1
        logger.warning(
            "autoscaler pulled %s back to %d workers (phase needs %d); re-asserting",
            self._ref,
            desired,
            claim.replicas,
        )
        if not reconciled:
            self._backend.reconcile(self._ref, wait=False, timeout=REASSERT_TIMEOUT)
