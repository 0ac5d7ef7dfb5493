"""flytekitplugins-ddlscale: cluster scaling as a first-class step of a Flyte flow.

Every user-facing name is importable from here (``from flytekitplugins_ddlscale import ScaleCluster``).
flytekit imports this package at start-up (``flytekit.plugins`` entry point), so only light modules load
here; task types, the phase decorator and every backend load on first use.
"""
import importlib
from typing import Any

from .errors import (
    AccessError, BackendUnavailableError, CapacityExceededError, CertificateRefusedError, ClusterFaultError,
    ClusterNotFoundError, ClusterStateError, ConflictError, CorruptRecordError, InterruptedChangeError,
    InvalidInputError, NeverReachedError, NotScalableError, ScalingError, ScalingTimeoutError, StateWriteError,
    TransientError, UnauthorizedError, UnconfirmedChangeError, UnknownTierError, UnreachableWaitError,
    UnsafePathError, UnsupportedOperationError, WorkerFailedError,
)
from .models import Baseline, ClusterState, ReplicaSpec, RestartResult, ScaleResult
from .refs import KINDS, ClusterRef, KindInfo

__version__ = "0.1.0"

_LAZY = {
    "get_backend": "flytekitplugins_ddlscale.backends",
    "ClusterBackend": "flytekitplugins_ddlscale.backends",
    "BackendCapabilities": "flytekitplugins_ddlscale.backends",
    "ScalerServiceBackend": "flytekitplugins_ddlscale.backends.scaler",
    "KubernetesBackend": "flytekitplugins_ddlscale.backends.kubernetes",
    "LocalBackend": "flytekitplugins_ddlscale.backends.local",
    "ScaleCluster": "flytekitplugins_ddlscale.tasks",
    "RestartHead": "flytekitplugins_ddlscale.tasks",
    "WaitForCluster": "flytekitplugins_ddlscale.tasks",
    "RestoreCluster": "flytekitplugins_ddlscale.tasks",
    "ScaleOutcome": "flytekitplugins_ddlscale.tasks",
    "RestartOutcome": "flytekitplugins_ddlscale.tasks",
    "ClusterReady": "flytekitplugins_ddlscale.tasks",
    "RestoreOutcome": "flytekitplugins_ddlscale.tasks",
    "distributed_phase": "flytekitplugins_ddlscale.phase",
    "cluster_phase": "flytekitplugins_ddlscale.phase",
    "PhaseInterrupted": "flytekitplugins_ddlscale.phase",
    "scale_down_on_failure": "flytekitplugins_ddlscale.workflow_helpers",
    "connected": "flytekitplugins_ddlscale.workflow_helpers",
    "HardwareTier": "flytekitplugins_ddlscale.backends.tiers",
    "TierCatalog": "flytekitplugins_ddlscale.backends.tiers",
    "FileTierCatalog": "flytekitplugins_ddlscale.backends.tiers",
    "DominoTierCatalog": "flytekitplugins_ddlscale.backends.tiers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flytekitplugins_ddlscale' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(list(globals()) + list(_LAZY))


__all__ = [
    "AccessError", "BackendUnavailableError", "Baseline", "CapacityExceededError", "CertificateRefusedError",
    "ClusterFaultError", "ClusterNotFoundError", "ClusterRef", "ClusterState", "ClusterStateError",
    "ConflictError", "CorruptRecordError", "InterruptedChangeError", "InvalidInputError", "KINDS", "KindInfo",
    "NeverReachedError", "NotScalableError", "ReplicaSpec", "RestartResult", "ScaleResult", "ScalingError",
    "ScalingTimeoutError", "StateWriteError", "TransientError", "UnauthorizedError", "UnconfirmedChangeError",
    "UnknownTierError", "UnreachableWaitError", "UnsafePathError", "UnsupportedOperationError",
    "WorkerFailedError",
    *_LAZY,
]
