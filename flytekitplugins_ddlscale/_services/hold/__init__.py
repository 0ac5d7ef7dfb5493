"""Hold a cluster at a size for the length of a block: the machinery of every phase.

``@distributed_phase`` (:mod:`..phase`) runs a Flyte task's body in one,
``ddlscale run`` (:mod:`..cli`) a command. Nothing here imports flytekit
(a Deck, when asked for, imports it at the end of the phase), so a command
line that holds a cluster does not pay for Flyte.
"""
from typing import Optional

from ...backends.base import DEFAULT_SCALE_TIMEOUT
from ..._core.leases import DEFAULT_LEASE_SECONDS
from ...refs import ClusterSpec
from .run import ClusterPhase
from .settings import (
    DEFAULT_REASSERT_INTERVAL,
    DEFAULT_SAMPLE_INTERVAL,
    RESTORE_BASELINE,
    PhaseSettings,
    Restore,
)
from .signals import PhaseInterrupted


def cluster_phase(
    cluster: ClusterSpec,
    replicas: int,
    worker_hw_tier: Optional[str] = None,
    head_hw_tier: Optional[str] = None,
    restore: Restore = RESTORE_BASELINE,
    timeout: float = DEFAULT_SCALE_TIMEOUT,
    backend: Optional[str] = None,
    *,
    framework_ready: bool = True,
    framework_url: Optional[str] = None,
    reassert_interval: Optional[float] = DEFAULT_REASSERT_INTERVAL,
    sample_interval: float = DEFAULT_SAMPLE_INTERVAL,
    deck: bool = True,
    label: str = "phase",
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    fail_on_fault: bool = False,
) -> ClusterPhase:
    """The phase as a context manager: ``with cluster_phase("dask/x", 4) as phase: ...``.

    Arguments as for :func:`distributed_phase`; invalid ones raise
    :class:`InvalidInputError` here, before anything is changed.
    """
    settings = PhaseSettings(
        cluster=cluster,  # type: ignore[arg-type]
        replicas=replicas,
        worker_hw_tier=worker_hw_tier,
        head_hw_tier=head_hw_tier,
        restore=restore,
        timeout=timeout,
        backend=backend,
        framework_ready=framework_ready,
        framework_url=framework_url,
        reassert_interval=reassert_interval,
        sample_interval=sample_interval,
        deck=deck,
        lease_seconds=lease_seconds,
        fail_on_fault=fail_on_fault,
    )
    return ClusterPhase(settings, label)


__all__ = ["ClusterPhase", "PhaseInterrupted", "PhaseSettings", "Restore", "RESTORE_BASELINE", "cluster_phase"]
