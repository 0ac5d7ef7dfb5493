"""How scaling nodes are named in Flyte: the task types, the output name, qualified task names.

Apart from the node types' modules so that flytekit's start-up (:mod:`...connector_entry`) registers the
connectors without loading them.
"""
from typing import Optional

SCALE_TASK_TYPE = "ddlscale_scale"
WAIT_TASK_TYPE = "ddlscale_wait"
RESTART_TASK_TYPE = "ddlscale_restart_head"
RESTORE_TASK_TYPE = "ddlscale_restore"
TASK_TYPES = (SCALE_TASK_TYPE, WAIT_TASK_TYPE, RESTART_TASK_TYPE, RESTORE_TASK_TYPE)
"""Every task type this plugin defines."""

OUTPUT_NAME = "o0"
"""The single output's name, as for function tasks, so ``up = scale_up()`` is the outcome itself."""


def qualified_name(name: str, module: Optional[str]) -> str:
    """``module.name`` for a plain ``name`` defined in ``module``; dotted names are taken as given."""
    if module and "." not in name:
        return f"{module}.{name}"
    return name
