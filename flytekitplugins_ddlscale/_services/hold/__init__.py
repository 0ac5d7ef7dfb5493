"""Hold a cluster at a size for the length of a block: the machinery of ``@distributed_phase`` and
``ddlscale run``. Nothing here imports flytekit (but a Deck, at the end of a phase that asks for one).
"""
from typing_extensions import Unpack

from ...refs import ClusterSpec
from .run import ClusterPhase
from .settings import RESTORE_BASELINE, PhaseOptions, PhaseSettings, Restore
from .signals import PhaseInterrupted


def cluster_phase(
    cluster: ClusterSpec, replicas: int, *, label: str = "phase", deck: bool = True, **options: Unpack[PhaseOptions]
) -> ClusterPhase:
    """The phase as a context manager: ``with cluster_phase("dask/x", 4) as phase: ...``; ``options`` are
    :class:`PhaseOptions`, ``label`` names the phase in logs and its claim. Bad arguments raise here."""
    return ClusterPhase(PhaseSettings(cluster, replicas, deck=deck, **options), label)  # type: ignore[arg-type]


def misplaced_phase(task_name: str, sdk: str, task_decorator: str) -> TypeError:
    """The error for ``@distributed_phase`` applied to ``sdk``'s task ``task_name`` instead of its function:
    the message shows it moved below ``task_decorator``, the line that makes the task."""
    below = task_decorator.split("(", 1)[0]
    short = task_name.rsplit(".", 1)[-1]
    return TypeError(
        f"@distributed_phase was applied to the {sdk} task {task_name!r}; it must wrap the function, "
        f"so put it below {below}:\n\n"
        f"    {task_decorator}\n"
        "    @distributed_phase(cluster=..., replicas=...)\n"
        f"    def {short}(...): ..."
    )


__all__ = [
    "ClusterPhase", "PhaseInterrupted", "PhaseOptions", "PhaseSettings", "Restore", "RESTORE_BASELINE", "cluster_phase",
    "misplaced_phase",
]
