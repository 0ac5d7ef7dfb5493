"""Hold a cluster at a size for the length of a block: the machinery of every phase.

``@distributed_phase`` (:mod:`..phase`) runs a Flyte task's body in one,
``ddlscale run`` (:mod:`..cli`) a command. Nothing here imports flytekit
(a Deck, when asked for, imports it at the end of the phase), so a command
line that holds a cluster does not pay for Flyte.
"""
from typing_extensions import Unpack

from ...refs import ClusterSpec
from .run import ClusterPhase
from .settings import RESTORE_BASELINE, PhaseOptions, PhaseSettings, Restore
from .signals import PhaseInterrupted


def cluster_phase(
    cluster: ClusterSpec, replicas: int, *, label: str = "phase", deck: bool = True, **options: Unpack[PhaseOptions]
) -> ClusterPhase:
    """The phase as a context manager: ``with cluster_phase("dask/x", 4) as phase: ...``.

    ``options``: :class:`PhaseOptions` (keywords); ``deck`` publishes the
    phase's page; ``label`` names the phase in logs and its claim. Invalid
    arguments raise :class:`InvalidInputError` here, before anything is changed.
    """
    return ClusterPhase(PhaseSettings(cluster, replicas, deck=deck, **options), label)  # type: ignore[arg-type]


__all__ = ["ClusterPhase", "PhaseInterrupted", "PhaseOptions", "PhaseSettings", "Restore", "RESTORE_BASELINE", "cluster_phase"]
