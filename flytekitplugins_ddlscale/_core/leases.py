"""Claims are leases: live while their holder renews them, dropped once they lapse or their holder is gone.

A claim records who holds it (``host:pid``), when it was last renewed and
for how long a renewal counts. A claim is dead when its lease ran out (its
holder stopped renewing: killed, hung, its pod gone) or, at once, when its
holder is a process on this host that no longer runs. Every backend applies
these rules when it reads claims: dead claims are not counted, and the next
claim or reconcile drops them from the record and logs each with its holder.
Pure rules on anything shaped like a lease (:class:`Lease`: the records'
``Claim`` is one); nothing here touches a backend.
"""
import datetime
import logging
import os
import socket
from pathlib import Path
from typing import Callable, Dict, Optional, Protocol, Tuple, TypeVar

from ..models import utcnow

logger = logging.getLogger("flytekitplugins_ddlscale._core.records")

DEFAULT_LEASE_SECONDS = 90.0
"""How long a claim stays live after its last renewal: its holder renews every third of it, so two
renewals in a row may fail (an API server restart) before the claim lapses."""
MAX_LEASE_SECONDS = 24 * 3600.0
"""The longest lease a record may carry (longer is refused as corrupt)."""
RENEWALS_PER_LEASE = 3


class Lease(Protocol):
    """What these rules read of a claim."""

    replicas: int
    holder: str
    created_at: str
    renewed_at: str
    lease_seconds: float


LeaseT = TypeVar("LeaseT", bound=Lease)


def renew_interval(lease_seconds: float) -> float:
    """Seconds between renewals of a claim with this lease."""
    return lease_seconds / RENEWALS_PER_LEASE


def this_holder() -> str:
    """``host:pid`` of this process, as a claim records its holder."""
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): existence is all that can be told
    return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")


def holder_gone(holder: str, running: Callable[[int], bool] = pid_running) -> bool:
    """Whether ``holder`` (``host:pid``) names a process of this host that no longer runs."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return int(pid) != os.getpid() and not running(int(pid))


def expires_at(claim: Lease) -> datetime.datetime:
    """When ``claim`` lapses unless renewed."""
    renewed = datetime.datetime.fromisoformat(claim.renewed_at)
    return renewed + datetime.timedelta(seconds=claim.lease_seconds)


def why_dead(claim: Lease, now: Optional[datetime.datetime] = None) -> Optional[str]:
    """Why ``claim`` no longer counts (its lease ran out, its holder is gone), or None while it is live."""
    now = now or utcnow()
    if holder_gone(claim.holder):
        return f"its holder process {claim.holder} is gone"
    ends = expires_at(claim)
    if now >= ends:
        late = (now - ends).total_seconds()
        return f"its lease of {claim.lease_seconds:g}s ran out {late:.0f}s ago (holder {claim.holder} stopped renewing)"
    return None


def split_live(
    claims: Dict[str, LeaseT], now: Optional[datetime.datetime] = None
) -> Tuple[Dict[str, LeaseT], Dict[str, Tuple[LeaseT, str]]]:
    """``claims`` split into the live ones and the dead ones (each with why), by claim id."""
    now = now or utcnow()
    live: Dict[str, LeaseT] = {}
    dead: Dict[str, Tuple[LeaseT, str]] = {}
    for claim_id, claim in claims.items():
        reason = why_dead(claim, now)
        if reason is None:
            live[claim_id] = claim
        else:
            dead[claim_id] = (claim, reason)
    return live, dead


def log_dropped(cluster: str, dead: Dict[str, Tuple[Lease, str]]) -> None:
    """One warning per dead claim dropped from ``cluster``'s record, naming its holder."""
    for claim_id, (claim, reason) in sorted(dead.items()):
        logger.warning(
            "%s: dropped claim %s (%d workers, holder %s): %s", cluster, claim_id, claim.replicas, claim.holder, reason
        )


def age_seconds(claim: Lease, now: Optional[datetime.datetime] = None) -> float:
    """Seconds since ``claim`` was made."""
    return ((now or utcnow()) - datetime.datetime.fromisoformat(claim.created_at)).total_seconds()
