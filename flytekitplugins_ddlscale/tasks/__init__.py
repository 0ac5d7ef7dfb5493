"""Flyte task types that make cluster scaling a node of a flow.

``ScaleCluster``, ``RestartHead``, ``WaitForCluster`` and ``RestoreCluster`` are configured when
defined, take typed inputs (defaults from that configuration) and return a
typed dataclass that downstream nodes can depend on.
"""
from .config import ANY_DESIRED, FROM_BASELINE, RestartConfig, RestoreConfig, ScaleConfig, WaitConfig, resolve_cluster
from .outputs import UNKNOWN, ClusterReady, RestartOutcome, RestoreOutcome, ScaleOutcome
from .restart import RESTART_TASK_TYPE, RestartHead
from .restore import RESTORE_TASK_TYPE, RestoreCluster
from .scale import SCALE_TASK_TYPE, ScaleCluster
from .wait import WAIT_TASK_TYPE, WaitForCluster

TASK_TYPES = (SCALE_TASK_TYPE, RESTART_TASK_TYPE, WAIT_TASK_TYPE, RESTORE_TASK_TYPE)
"""Every task type this plugin defines (the connector serves ``SERVED_TASK_TYPES`` of them)."""

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
