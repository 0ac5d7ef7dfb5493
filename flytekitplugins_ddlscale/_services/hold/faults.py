"""What went wrong with a held cluster while a phase's body ran, in words the summary and Deck print.

A phase holds at least ``needed`` workers for its body. Its monitor reads the
cluster every sample and calls :func:`find_fault`: a head that stopped
answering (where the backend can see the head) or fewer workers up than
``needed``, for any reason (workers lost, or the cluster scaled below the
phase's claim), is a fault; so is the phase's claim found lapsed or dropped
(the monitor's renewal). Each fault is one :class:`Fault` from the moment it is
seen until the cluster is whole again, with what the phase did about it.
"""
from dataclasses import dataclass
from typing import Optional

from ...models import ClusterState
from ..._core.timeline import observed_workers
from ..._core.wording import plural

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
    """What is wrong with ``state`` for a body that needs ``needed`` workers, or None when nothing is.

    A lost head is named alone (its workers go with it); an unknown head
    readiness (``head_ready`` None) is not a fault. Workers are lost when
    fewer than ``needed`` are up while the cluster still wants at least
    ``needed``; fewer up while it wants fewer is a size scaled below the
    phase's need (an autoscaler, another process that dropped the phase's
    claim). A size pulled back while the workers are still up is not yet a
    fault (the monitor's re-assert may put it back first).
    """
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
