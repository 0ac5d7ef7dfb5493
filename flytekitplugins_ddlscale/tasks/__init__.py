"""Flyte task types that make cluster scaling a node of a flow.

``ScaleCluster``, ``RestartHead``, ``WaitForCluster`` and ``RestoreCluster`` are configured when
defined, take typed inputs (defaults from that configuration) and return a
typed dataclass that downstream nodes can depend on. Their configurations,
outcomes and task type names live in :mod:`..nodes` (shared with the
connector) and are re-exported here; ``resolve_cluster`` is
:func:`..refs.parse_cluster`.
"""
from .._services.nodes.config import ANY_DESIRED, FROM_BASELINE, RestartConfig, RestoreConfig, ScaleConfig, WaitConfig
from .._services.nodes.names import RESTART_TASK_TYPE, RESTORE_TASK_TYPE, SCALE_TASK_TYPE, TASK_TYPES, WAIT_TASK_TYPE
from .._services.nodes.outputs import UNKNOWN, ClusterReady, RestartOutcome, RestoreOutcome, ScaleOutcome
from ..refs import parse_cluster as resolve_cluster
from .nodes import RestartHead, RestoreCluster, ScaleCluster, WaitForCluster

__all__ = [
    "ANY_DESIRED",
    "ClusterReady",
    "FROM_BASELINE",
    "RESTART_TASK_TYPE",
    "RestartConfig",
    "RestartHead",
    "RestartOutcome",
    "RESTORE_TASK_TYPE",
    "RestoreCluster",
    "RestoreConfig",
    "RestoreOutcome",
    "SCALE_TASK_TYPE",
    "ScaleCluster",
    "ScaleConfig",
    "ScaleOutcome",
    "TASK_TYPES",
    "UNKNOWN",
    "WAIT_TASK_TYPE",
    "WaitConfig",
    "WaitForCluster",
    "resolve_cluster",
]
