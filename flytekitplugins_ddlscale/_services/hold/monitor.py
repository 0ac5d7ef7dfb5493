"""The one background thread of a phase: renews its claim (from :meth:`PhaseMonitor.start`), and while
the body runs (:meth:`PhaseMonitor.watch`) samples the cluster, holds its size and answers faults
(:class:`Fault`; docs/reliability.md). After :meth:`PhaseMonitor.stop` no call that changes records runs.
"""
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

from ...backends._base import ClusterBackend
from ...errors import ClusterNotFoundError
from ...models import ClusterState
from ..._core.leases import ClockReading, HolderClock, read_clocks, renew_interval
from ..._core.claimrules import largest_claim
from ..._core.records import Claim
from ...refs import ClusterRef
from ..._core.timeline import WorkerTimeline, observed_workers
from ..._core.progress import plural

logger = logging.getLogger("flytekitplugins_ddlscale")

REPAIRED = "repair sent (head restarted on its port, lost workers replaced)"
REPORTED = "reported only (this backend's operator repairs the cluster)"
FAILED = "the phase was failed (fail_on_fault)"
RECLAIMED = "claimed again and the cluster brought back to its size"
REASSERTED = "its claim re-asserted (the cluster brought back to its size)"
NOT_RECLAIMED = "not claimed again (a restore ends every phase)"


def head_name(kind: str) -> str:
    """What the head is called for a kind (``scheduler`` for Dask)."""
    return "scheduler" if kind == "dask" else "head"


def find_fault(state: ClusterState, needed: int, head: str = "head") -> Optional[str]:
    """What is wrong with ``state`` for a body that needs ``needed`` workers, or None when nothing is:
    a lost head (an unknown one is not a fault), workers lost (fewer up than ``needed`` while the
    cluster wants that many), or a size scaled below the need with fewer up. A size pulled back while
    its workers are still up is not yet a fault: the re-assert may put it back first."""
    up = observed_workers(state)
    if state.head_ready is False:
        return f"the {head} of {state.cluster} stopped answering ({up} of {needed} workers up)"
    if up >= needed:
        return None
    if needed <= state.desired_workers:
        return f"{state.cluster} has {up} of its {plural(needed, 'worker')} up ({needed - up} lost)"
    return (
        f"{state.cluster} was scaled down to {plural(state.desired_workers, 'worker')} "
        f"({up} up), below the {needed} this phase needs"
    )


@dataclass
class Fault:
    """One fault, from the first sample that saw it to the first that found the cluster whole again."""

    what: str
    began: float
    """Seconds into the phase when it was first seen."""
    action: str = ""
    """What the phase did: :data:`REPAIRED`, :data:`REPORTED`, :data:`FAILED`, or a repair's error."""
    ended: Optional[float] = None
    """Seconds into the phase when the cluster was whole again; None while it lasts."""

    def text(self) -> str:
        """``<what> at 8.1 s; <action>; whole again after 3.2 s`` (or ``; not whole again by the end``)."""
        recovery = (
            f"whole again after {self.ended - self.began:.1f} s" if self.ended is not None
            else "not whole again by the end"
        )
        action = f"; {self.action}" if self.action else ""
        return f"{self.what} at {self.began:.1f} s{action}; {recovery}"


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
        claim: Claim,
        timeline: WorkerTimeline,
        *,
        on_fault: Optional[Callable[[Fault], None]] = None,
        claimed_at: Optional[ClockReading] = None,
    ) -> None:
        """Holds ``claim`` (claimed again at its size should it lapse); ``on_fault``: the phase fails at
        the first fault and this is called, instead of the fault being repaired; ``claimed_at``: the
        :func:`read_clocks` reading taken when the claim was sent (None: now)."""
        self._backend = backend
        self._ref = ref
        self._claim_id = claim.claim_id
        self._replicas = claim.replicas
        self._lease = claim.lease_seconds
        self._held = HolderClock(claimed_at)
        """Time since the claim was last made or renewed, as this process can tell after a stop."""
        self._renew_every = renew_interval(claim.lease_seconds)
        self._timeline = timeline
        self._tier = claim.worker_hw_tier
        self._sample_interval = 5.0
        self._on_fault = on_fault
        self._began = time.monotonic()
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
        """With ``on_fault``: the fault that failed the phase."""

    def start(self) -> None:
        """Start the thread: lease renewals from now on."""
        self._thread.start()

    def watch(self, needed: int, reassert_interval: Optional[float], sample_interval: float = 5.0) -> None:
        """From now on also sample the cluster every ``sample_interval`` s, re-assert every
        ``reassert_interval`` s (None: never), and treat fewer than ``needed`` workers or a lost head as a fault."""
        self._reassert_interval = reassert_interval
        self._sample_interval = sample_interval
        self._needed = needed
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread and wait (at most ``timeout`` seconds) for a call in flight to finish: once this
        returns, no renewal, re-assert or repair can start (one still in flight after ``timeout`` is logged)."""
        self._stop.set()
        self._wake.set()
        if self._in_flight.acquire(timeout=timeout):
            self._in_flight.release()
        else:
            logger.warning("phase monitor of %s: a call is still in flight after %.0fs", self._ref, timeout)
        self._thread.join(timeout)

    # ------------------------------------------------------------ the loop

    def _elapsed(self) -> float:
        return time.monotonic() - self._began

    def _run(self) -> None:
        now = time.monotonic()
        next_renewal = now + self._renew_every
        next_sample = now
        next_reassert: Optional[float] = None
        while True:
            self._wake.wait(self._tick())
            self._wake.clear()
            if self._stop.is_set():
                return
            now = time.monotonic()
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
        if not lapsed:
            fault = self._open_fault()
            if fault is not None:
                fault.action = NOT_RECLAIMED
            return
        self._reclaim = True
        self._claim_again()

    def _claim_again(self) -> None:
        """Claim the lapsed claim again and bring the cluster back to its size; a claim that fails (an
        outage) is tried again at the next renewal tick."""
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
        """Record ``problem`` (a new fault unless one is open), fail the phase given ``on_fault``, else
        repair: a size ``pulled_back`` below the claim is re-asserted on every backend, lost processes
        are replaced where the backend repairs them. ``record_only``: the caller repairs."""
        fault = self.faults[-1] if self._fault_open() else None
        if fault is None:
            fault = Fault(problem, self._elapsed())
            self.faults.append(fault)
            self._timeline.mark("fault")
            logger.error("phase %s: %s", self._claim_id, problem)
            if self._on_fault is not None:
                fault.action = FAILED
                self.failed = fault
                logger.error("phase %s: failing the phase (fail_on_fault)", self._claim_id)
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
        # From the claims live now (never shrinking another phase); a repeat starts nothing twice.
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
        """Bring the size pulled back to ``desired`` up to the largest claim (never claiming again: a claim
        `ddlscale restore` dropped stays dropped); not again where this sample's fault already did it
        (``reconciled``: a lagging read could send the same scale twice)."""
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
            "autoscaler pulled %s back to %d workers (phase needs %d); re-asserting", self._ref, desired, claim.replicas
        )
        if not reconciled:
            self._backend.reconcile(self._ref, wait=False, timeout=REASSERT_TIMEOUT)
