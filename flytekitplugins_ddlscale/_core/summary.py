"""The one line each node and phase ends with, e.g. ``scale_up: dask/x 0 -> 2 workers ready in 5.3 s``.

Pure formatting from an outcome's fields (read by name, so any outcome
with those fields works); :func:`~flytekitplugins_ddlscale._core.progress.emit_summary`
prints the line. Where an outcome carries a non-empty ``readiness`` string
(what the framework reported), it is appended as ``(framework: ...)``.
"""
from typing import Any, Optional, Sequence, Tuple

from .wording import plural

UNKNOWN = -1
"""Integer fields use -1 for "not observable" (as ``nodes.outputs.UNKNOWN``)."""


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


def _took(waited: float, total: Optional[float]) -> str:
    """``in 4.0 s``: the step's own time, start to end, and how much of it was waiting when that differs."""
    if total is None or total - waited < 0.05:
        return f"in {_seconds(max(waited, total or 0.0))}"
    return f"in {_seconds(total)} ({_seconds(waited)} waiting)"


def workers(count: int) -> str:
    """``1 worker``, ``2 workers``."""
    return plural(count, "worker")


def _tier(outcome: Any) -> str:
    tier = getattr(outcome, "worker_hw_tier", "")
    return f" on {tier}" if tier else ""


def _readiness(outcome: Any) -> str:
    # Nothing needs proving about zero workers.
    readiness = getattr(outcome, "readiness", "") if getattr(outcome, "workers", None) != 0 else ""
    return f" (framework: {readiness})" if readiness else ""


def _arrived(outcome: Any, count: int, before: Optional[int] = None) -> str:
    """``ready`` where readiness is observable, else what the backend could see; a shrink is just a count."""
    if count == 0 or (before is not None and count < before):
        return workers(count)
    if getattr(outcome, "ready_workers", UNKNOWN) == UNKNOWN:
        return f"{workers(count)} up (readiness not observable)"
    return f"{workers(count)} ready"


def _found(outcome: Any, asked: int) -> int:
    """The workers to report once a wait for ``asked`` ended: the Ready ones where known and the
    cluster wants more than ``asked`` (an autoscaler above a held floor), else ``asked``."""
    ready = getattr(outcome, "ready_workers", UNKNOWN)
    return ready if outcome.workers > asked and ready != UNKNOWN else asked


def _above(outcome: Any, asked: int) -> str:
    """`` (at least 3 held; the cluster wants 5)`` when the cluster wants more than ``asked``."""
    return f" (at least {asked} held; the cluster wants {outcome.workers})" if outcome.workers > asked else ""


def scale_line(step: str, outcome: Any, seconds_total: Optional[float] = None) -> str:
    """The summary of a ``ScaleCluster`` node (fields of ``ScaleOutcome``); ``seconds_total`` is the
    node's own time, start to end (creating a cluster included), when the caller measured it. The
    counts are what the wait found: with an autoscaler above the size set, the workers Ready and
    the size the cluster wants."""
    change = f"{outcome.cluster} {outcome.previous_workers} -> "
    capped = f", capped from {outcome.requested}" if outcome.capped else ""
    if not outcome.waited:
        return f"{step}: {change}{workers(outcome.effective)}{_tier(outcome)} requested, not waited for{capped}"
    arrived = _arrived(outcome, _found(outcome, outcome.effective), outcome.previous_workers)
    return (
        f"{step}: {change}{arrived}{_above(outcome, outcome.effective)}{_tier(outcome)} "
        f"{_took(outcome.seconds_waited, seconds_total)}{capped}{_readiness(outcome)}"
    )


def wait_line(step: str, outcome: Any, seconds_total: Optional[float] = None) -> str:
    """The summary of a ``WaitForCluster`` node (fields of ``ClusterReady``); ``seconds_total`` as in
    :func:`scale_line`. The workers reported are the Ready ones where known (a wait may end below
    the size the cluster wants, an autoscaler's above a held floor), else the size it wants."""
    took = _seconds(max(outcome.seconds_waited, seconds_total or 0.0))
    ready = getattr(outcome, "ready_workers", UNKNOWN)
    count = outcome.workers if ready == UNKNOWN else ready
    wants = f" (the cluster wants {outcome.workers})" if count < outcome.workers else ""
    return f"{step}: {outcome.cluster} {_arrived(outcome, count)}{wants} after {took}{_readiness(outcome)}"


def restart_line(step: str, outcome: Any, seconds_total: Optional[float] = None) -> str:
    """The summary of a ``RestartHead`` node (fields of ``RestartOutcome``); ``seconds_total`` as in
    :func:`scale_line`."""
    tier = f" on {outcome.head_hw_tier}" if outcome.head_hw_tier else ""
    if not outcome.waited:
        return f"{step}: {outcome.cluster} head {outcome.pod} restart requested{tier}, not waited for"
    state = "ready" if outcome.ready else "not seen ready"
    return f"{step}: {outcome.cluster} head {outcome.pod} restarted{tier}, {state} {_took(outcome.seconds_waited, seconds_total)}"


def restore_line(step: str, outcome: Any, seconds_total: Optional[float] = None) -> str:
    """The summary of a ``RestoreCluster`` node (fields of ``RestoreOutcome``); ``seconds_total`` as in
    :func:`scale_line`."""
    if outcome.restored == "nothing recorded":
        return f"{step}: {outcome.cluster} unchanged at {workers(outcome.workers)} (no baseline recorded)"
    change = f"{outcome.cluster} {outcome.previous_workers} -> "
    if not outcome.waited and outcome.workers > 0:
        return f"{step}: {change}{workers(outcome.workers)}{_tier(outcome)} ({outcome.restored}) requested, not waited for"
    return (
        f"{step}: {change}{_arrived(outcome, outcome.workers, outcome.previous_workers)}{_tier(outcome)} ({outcome.restored}) "
        f"{_took(outcome.seconds_waited, seconds_total)}"
    )


def phase_line(
    label: str,
    cluster: str,
    before: Optional[int],
    held: Optional[int],
    seconds_to_ready: Optional[float],
    seconds_total: float,
    restored_to: Optional[str],
    error: Optional[BaseException],
    readiness: str = "",
    body_failure: Optional[str] = None,
    *,
    found: Optional[Tuple[int, int]] = None,
    faults: Sequence[str] = (),
) -> str:
    """The summary of a ``@distributed_phase`` / ``cluster_phase`` run, printed when it ends.

    ``held`` None means the cluster never reached the phase's size (the
    error says why); ``restored_to`` None means nothing was restored;
    ``body_failure`` names how a block failed without raising (``exit 7``);
    ``found`` is (workers up, workers the cluster wants) when the wait ended,
    reported where the cluster wants more than ``held`` (an autoscaler above
    the held floor); ``faults`` are what went wrong with the cluster during
    the body, each as the phase's monitor describes it.
    """
    framework = f" (framework: {readiness})" if readiness else ""
    if held is None:
        start = f"{label}: {cluster} not scaled"
    else:
        up, above = held, ""
        if found is not None and found[1] > held:
            up, above = max(found[0], held), f" (at least {held} held; the cluster wants {found[1]})"
        start = (
            f"{label}: {cluster} {before} -> {workers(up)} ready{above} in {_seconds(seconds_to_ready or 0.0)}"
            f"{framework}"
        )
    if error is not None:
        outcome = f"failed after {_seconds(seconds_total)} ({type(error).__name__})"
    elif body_failure is not None:
        outcome = f"failed ({body_failure}) after {_seconds(seconds_total)}"
    else:
        outcome = f"done after {_seconds(seconds_total)}"
    restore = f", restored to {restored_to}" if restored_to else ""
    during = f"; {plural(len(faults), 'fault')} during the body: {' | '.join(faults)}" if faults else ""
    return f"{start}; {outcome}{restore}{during}"
