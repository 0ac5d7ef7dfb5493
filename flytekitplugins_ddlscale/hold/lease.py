"""Keep a phase's claim alive: renew its lease in the background from the claim to the release.

A claim is a lease (:mod:`..leases`): a phase that stops renewing it (killed,
hung) loses it once the lease runs out, so a dead phase never holds a
cluster up. The renewals start right after the claim, before the scale-up
wait, so a long wait for workers never lets the claim lapse. A renewal that
fails (an outage) is logged and tried again at the next tick; a claim found
gone (``ddlscale restore`` dropped it) is logged once and not re-added.
"""
import logging
import threading
from typing import Optional

from ..backends.base import ClusterBackend
from ..leases import renew_interval
from ..refs import ClusterRef

logger = logging.getLogger("flytekitplugins_ddlscale")


class LeaseKeeper:
    """Renews ``claim_id`` on ``ref`` every third of ``lease_seconds`` until :meth:`stop`."""

    def __init__(self, backend: ClusterBackend, ref: ClusterRef, claim_id: str, lease_seconds: float) -> None:
        self._backend = backend
        self._ref = ref
        self._claim_id = claim_id
        self._interval = renew_interval(lease_seconds)
        self._stop = threading.Event()
        # Held while a renewal is in flight, so stop() can make sure none is running before the release.
        self._renewing = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"ddlscale-lease-{ref.name}", daemon=True)
        self.renewals = 0
        """Renewals that reached the record."""
        self.lost: Optional[str] = None
        """Set when the claim was found gone from the record."""

    def start(self) -> None:
        """Start renewing."""
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop renewing; once this returns no renewal runs (one in flight after ``timeout`` is logged)."""
        self._stop.set()
        if self._renewing.acquire(timeout=timeout):
            self._renewing.release()
        else:
            logger.warning("phase %s: a lease renewal is still in flight after %.0fs", self._claim_id, timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._renewing:
                if self._stop.is_set():
                    return
                try:
                    renewed = self._backend.renew(self._ref, self._claim_id)
                except Exception as exc:  # an outage: the lease has room for two more tries
                    logger.warning("phase %s could not renew its claim on %s: %s", self._claim_id, self._ref, exc)
                    continue
                if renewed is None:
                    self.lost = "the claim is gone from the record (dropped by a restore, or as dead)"
                    logger.error(
                        "phase %s: its claim on %s is gone (dropped by `ddlscale restore`, or lapsed); "
                        "the cluster no longer holds workers for it", self._claim_id, self._ref,
                    )
                    return
                self.renewals += 1
