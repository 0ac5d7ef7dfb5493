"""Flyte task types that make cluster scaling a node of a flow: ``ScaleCluster``, ``RestartHead``,
``WaitForCluster`` and ``RestoreCluster``, configured when defined, with typed inputs (defaults from that
configuration) and a typed dataclass output; ``resolve_cluster`` is :func:`..refs.parse_cluster`.
"""
from .._services.nodes.kinds import UNKNOWN
from .._services.nodes.names import TASK_TYPES
from .._services.nodes.restore import FROM_BASELINE
from .._services.nodes.wait import ANY_DESIRED
from ..refs import parse_cluster as resolve_cluster
from . import nodes
from .nodes import *  # noqa: F401,F403 - every node type with its configuration, outcome and task type

__all__ = ["ANY_DESIRED", "FROM_BASELINE", "TASK_TYPES", "UNKNOWN", "resolve_cluster", *nodes.__all__]
