"""Claims are leases: live while their holder renews them, dead once they lapse or their holder (a process on
this host) is gone. Others judge a lease by wall time; the holder by :class:`HolderClock`, so a holder stopped
or suspended knows at once it may have lost it. Pure rules on a :class:`Lease`; nothing touches a backend."""
import datetime
import logging
import os
import socket
import time
from typing import Dict, Optional, Protocol, Tuple, TypeVar

import psutil

from ..models import utcnow

logger = logging.getLogger("flytekitplugins_ddlscale._core.records")

DEFAULT_LEASE_SECONDS = 90.0
"""How long a claim stays live after its last renewal: its holder renews every third of it, so two
renewals in a row may fail (an API server restart) before the claim lapses."""
MAX_LEASE_SECONDS = 3600.0
"""The longest lease a phase may ask for and a record may carry (longer is refused as corrupt): a claim
its holder stopped renewing holds the cluster at most an hour."""
RENEWALS_PER_LEASE = 3


class Lease(Protocol):
    """What these rules read of a claim."""

    replicas: int
    holder: str
    holder_start: Optional[int]
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


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""Clock ticks per second: the unit of a recorded process start time."""
ENDED = frozenset({psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD})
"""What ``psutil`` says of a process that exited and waits only to be reaped."""


def process_start(pid: int) -> Optional[int]:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``'s number, as records
    keep it), or None when it does not run: a zombie whose other threads (holding its sockets) are gone."""
    try:
        process = psutil.Process(pid)
        if process.status() in ENDED and process.num_threads() <= 1:
            return None
        return round((process.create_time() - psutil.boot_time()) * CLOCK_TICKS)
    except psutil.Error:
        return None


def this_holder_start() -> Optional[int]:
    """This process's start time, as a claim records it beside :func:`this_holder`."""
    return process_start(os.getpid())


def holder_gone(holder: str, start: Optional[int] = None) -> bool:
    """Whether ``holder`` (``host:pid``) names a process of this host that no longer runs, or, with its
    ``start`` time recorded, a pid that now belongs to a process started at another time (without it, a
    running holder cannot be proved alive either: its lease decides)."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    started = process_start(int(pid))
    return started is None or (start is not None and started != start)


def expires_at(claim: Lease) -> datetime.datetime:
    """When ``claim`` lapses unless renewed (the latest time there is, for a lease ending past it)."""
    renewed = datetime.datetime.fromisoformat(claim.renewed_at)
    try:
        return renewed + datetime.timedelta(seconds=claim.lease_seconds)
    except OverflowError:
        return datetime.datetime.max.replace(tzinfo=renewed.tzinfo)


def why_dead(claim: Lease, now: Optional[datetime.datetime] = None) -> Optional[str]:
    """Why ``claim`` no longer counts (its lease ran out, its holder is gone), or None while it is live."""
    now = now or utcnow()
    if holder_gone(claim.holder, claim.holder_start):
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


def dead_text(claim: Lease) -> str:
    """What a dead ``claim`` still on record held, for ``status`` and ``list``: ``3 held by a run that is
    gone since <its last renewal>`` (or that stopped renewing, when its holder may still run)."""
    label = claim.claim_id.split("-", 1)[0] if claim.claim_id.startswith(("run-", "phase-")) else "phase"
    if holder_gone(claim.holder, claim.holder_start):
        return f"{claim.replicas} held by a {label} that is gone since {claim.renewed_at}"
    return (
        f"{claim.replicas} held by a {label} that stopped renewing at {claim.renewed_at} "
        f"(its lease of {claim.lease_seconds:g}s ran out)"
    )


def age_seconds(claim: Lease, now: Optional[datetime.datetime] = None) -> float:
    """Seconds since ``claim`` was made."""
    return ((now or utcnow()) - datetime.datetime.fromisoformat(claim.created_at)).total_seconds()


def _boot_clock() -> float:
    """Seconds on a clock that runs while the system is suspended (CLOCK_BOOTTIME), else monotonic."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


ClockReading = Tuple[float, float, float]
"""The monotonic, boot-time and wall clocks read at one moment (:func:`read_clocks`)."""


def read_clocks() -> ClockReading:
    """The three clocks :class:`HolderClock` counts by, read now."""
    return time.monotonic(), _boot_clock(), time.time()


class HolderClock:
    """How long since a holder last renewed its claim, as the holder itself can tell: the longest of the
    monotonic clock (runs through SIGSTOP), the boot-time clock (runs through a suspend) and wall time
    (what other processes judge by) since :meth:`mark`, given the clocks read *before* the renewal was
    sent, so a stop between the write and its answer counts against the lease."""

    def __init__(self, since: Optional[ClockReading] = None) -> None:
        self.mark(since)

    def mark(self, at: Optional[ClockReading] = None) -> None:
        """The claim was renewed (or made) by a request sent at ``at`` (:func:`read_clocks`; None: now)."""
        self._marks = at if at is not None else read_clocks()

    def since(self) -> float:
        """Seconds since the last mark on the clock that counts the most."""
        mono, boot, wall = self._marks
        return max(time.monotonic() - mono, _boot_clock() - boot, time.time() - wall)
