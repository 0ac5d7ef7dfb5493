"""Flyte task types that make cluster scaling a node of a flow.

``ScaleCluster``, ``RestartHead`` and ``WaitForCluster`` are configured when
defined, take typed inputs (defaults from that configuration) and return a
typed dataclass that downstream nodes can depend on.
"""
from .config import ANY_DESIRED, RestartConfig, ScaleConfig, WaitConfig, resolve_cluster
from .outputs import UNKNOWN, ClusterReady, RestartOutcome, ScaleOutcome
from .restart import RESTART_TASK_TYPE, RestartHead
from .scale import SCALE_TASK_TYPE, ScaleCluster
from .wait import WAIT_TASK_TYPE, WaitForCluster

TASK_TYPES = (SCALE_TASK_TYPE, RESTART_TASK_TYPE, WAIT_TASK_TYPE)
"""Every task type this plugin defines (the connector serves all of them)."""

__all__ = [
    "ANY_DESIRED",
    "ClusterReady",
    "RESTART_TASK_TYPE",
    "RestartConfig",
    "RestartHead",
    "RestartOutcome",
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
