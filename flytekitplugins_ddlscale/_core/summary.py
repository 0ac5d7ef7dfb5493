"""The one line each node and phase ends with, e.g. ``scale_up: dask/x 0 -> 2 workers ready in 5.3 s``: the
phase's (:class:`PhaseEnd`) and the pieces of every node type's, formatted from an outcome's fields by name."""
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

from .progress import plural

UNKNOWN = -1
"""Integer fields use -1 for "not observable" (as ``nodes.kinds.UNKNOWN``)."""


def seconds(value: float) -> str:
    """``4.0 s``."""
    return f"{value:.1f} s"


def took(waited: float, total: Optional[float]) -> str:
    """``in 4.0 s``: the step's own time, start to end, and how much of it was waiting when that differs."""
    if total is None or total - waited < 0.05:
        return f"in {seconds(max(waited, total or 0.0))}"
    return f"in {seconds(total)} ({seconds(waited)} waiting)"


def workers(count: int) -> str:
    """``1 worker``, ``2 workers``."""
    return plural(count, "worker")


def tier_note(outcome: Any) -> str:
    """`` on <tier>`` for an outcome with a worker tier, else ''."""
    tier = getattr(outcome, "worker_hw_tier", "")
    return f" on {tier}" if tier else ""


def framework_note(outcome: Any) -> str:
    """`` (framework: <what proved readiness>)`` for an outcome that says so, else ''."""
    # Nothing needs proving about zero workers.
    readiness = getattr(outcome, "readiness", "") if getattr(outcome, "workers", None) != 0 else ""
    return f" (framework: {readiness})" if readiness else ""


def arrived(outcome: Any, count: int, before: Optional[int] = None) -> str:
    """``ready`` where readiness is observable, else what the backend could see; a shrink is just a count."""
    if count == 0 or (before is not None and count < before):
        return workers(count)
    if getattr(outcome, "ready_workers", UNKNOWN) == UNKNOWN:
        return f"{workers(count)} up (readiness not observable)"
    return f"{workers(count)} ready"


def found(outcome: Any, asked: int) -> int:
    """The workers to report once a wait for ``asked`` ended: the Ready ones where known and the
    cluster wants more than ``asked`` (an autoscaler above a held floor), else ``asked``."""
    ready = getattr(outcome, "ready_workers", UNKNOWN)
    return ready if outcome.workers > asked and ready != UNKNOWN else asked


def above(outcome: Any, asked: int) -> str:
    """`` (at least 3 held; the cluster wants 5)`` when the cluster wants more than ``asked``."""
    return f" (at least {asked} held; the cluster wants {outcome.workers})" if outcome.workers > asked else ""


@dataclass(frozen=True)
class PhaseEnd:
    """What the line a ``@distributed_phase`` / ``cluster_phase`` run ends with reports (:meth:`line`)."""

    label: str
    cluster: str
    seconds_total: float
    scaled: Optional[Tuple[int, int, float]] = None
    """(workers before, workers held, seconds to ready); None: the cluster never reached the phase's
    size (the error says why)."""
    restored_to: Optional[str] = None
    """What the cluster was restored to; None: nothing was."""
    error: Optional[BaseException] = None
    readiness: str = ""
    body_failure: Optional[str] = None
    """How a block failed without raising (``exit 7``)."""
    found: Optional[Tuple[int, int]] = None
    """(workers up, workers the cluster wants) when the wait ended, reported where it wants more than held."""
    faults: Sequence[str] = ()
    """What went wrong with the cluster during the body, as the phase's monitor describes it."""

    def line(self) -> str:
        """``train: dask/x 0 -> 4 workers ready in 3.0 s; done after 10.0 s, restored to ...``."""
        framework = f" (framework: {self.readiness})" if self.readiness else ""
        if self.scaled is None:
            start = f"{self.label}: {self.cluster} not scaled"
        else:
            before, held, to_ready = self.scaled
            up, above = held, ""
            if self.found is not None and self.found[1] > held:
                up, above = max(self.found[0], held), f" (at least {held} held; the cluster wants {self.found[1]})"
            start = f"{self.label}: {self.cluster} {before} -> {workers(up)} ready{above} in {seconds(to_ready)}{framework}"
        total = seconds(self.seconds_total)
        if self.error is not None:
            outcome = f"failed after {total} ({type(self.error).__name__})"
        elif self.body_failure is not None:
            outcome = f"failed ({self.body_failure}) after {total}"
        else:
            outcome = f"done after {total}"
        restore = f", restored to {self.restored_to}" if self.restored_to else ""
        faults = self.faults
        during = f"; {plural(len(faults), 'fault')} during the body: {' | '.join(faults)}" if faults else ""
        return f"{start}; {outcome}{restore}{during}"
