"""A background thread that samples the cluster during a phase and holds its size.

Sampling feeds the phase's Deck. Where the backend cannot hold the size
against the cluster's autoscaler (``capabilities.holds_size`` is False: the
scaler service only sets ``spec.worker.replicas`` and the HPA may undo it),
the thread also re-asserts the phase's claim (through the backend's atomic
``reconcile``) and logs each pull-back.
"""
import logging
import threading
import time
from typing import Optional

from ..backends.base import ClusterBackend
from ..records import largest_claim
from ..refs import ClusterRef
from ..timeline import WorkerTimeline, observed_workers

logger = logging.getLogger("flytekitplugins_ddlscale")


REASSERT_TIMEOUT = 20.0
"""Seconds one re-assert may take, riding out an outage included: shorter than :meth:`PhaseMonitor.stop`
waits, so a re-assert never outlives the phase's body (the next tick tries again)."""


class PhaseMonitor:
    """Samples every ``sample_interval`` seconds; re-asserts every ``reassert_interval`` when asked."""

    def __init__(
        self,
        backend: ClusterBackend,
        ref: ClusterRef,
        claim_id: str,
        worker_hw_tier: Optional[str],
        timeline: WorkerTimeline,
        sample_interval: float,
        reassert_interval: Optional[float],
    ) -> None:
        self._backend = backend
        self._ref = ref
        self._claim_id = claim_id
        self._tier = worker_hw_tier
        self._timeline = timeline
        self._sample_interval = sample_interval
        self._reassert_interval = reassert_interval
        self._stop = threading.Event()
        # Held while a re-assert is in flight, so stop() can make sure none is
        # running (and none will start) before the phase releases its claim.
        self._reassert_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"ddlscale-phase-{ref.name}", daemon=True)
        self.pullbacks = 0
        """How many times the size was found pulled back and re-asserted."""

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread and wait (at most ``timeout`` seconds) for a call in flight to finish.

        Once this returns, no re-assert can start any more; one still in
        flight after ``timeout`` (a hanging backend) is logged.
        """
        self._stop.set()
        if self._reassert_lock.acquire(timeout=timeout):
            self._reassert_lock.release()
        else:
            logger.warning("phase monitor of %s: a re-assert is still in flight after %.0fs", self._ref, timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        tick = self._sample_interval
        if self._reassert_interval is not None:
            tick = min(tick, self._reassert_interval)
        next_reassert = time.monotonic() + (self._reassert_interval or 0.0)
        while not self._stop.wait(tick):
            try:
                state = self._backend.get_state(self._ref)
                self._timeline.add(observed_workers(state), state.worker_hw_tier or self._tier)
                if self._reassert_interval is not None and time.monotonic() >= next_reassert:
                    next_reassert = time.monotonic() + self._reassert_interval
                    with self._reassert_lock:
                        # The phase may have ended during get_state(): a claim
                        # re-added after its release would hold the cluster up.
                        if self._stop.is_set():
                            return
                        self._reassert(state.desired_workers)
            except Exception as exc:  # a sampling hiccup must not end the phase's body
                logger.warning("phase monitor of %s: %s", self._ref, exc)

    def _reassert(self, desired: int) -> None:
        # A renewal, never a re-claim: a claim `ddlscale restore` dropped stays dropped. The
        # reconcile decides from the claims live at its own moment, so a concurrent larger
        # phase is never shrunk by this re-assert.
        if self._backend.renew(self._ref, self._claim_id) is None:
            logger.warning("phase %s: its claim on %s is gone; not re-asserting", self._claim_id, self._ref)
            return
        claim = largest_claim(self._backend.claims(self._ref))
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
        self._backend.reconcile(self._ref, wait=False, timeout=REASSERT_TIMEOUT)
