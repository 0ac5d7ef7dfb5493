"""The scaling node types apart from Flyte: one module per type (:mod:`.scale`, :mod:`.wait`, :mod:`.restart`,
:mod:`.restore`), each declaring its :class:`~.kinds.NodeKind`, and ``NODE_KINDS``, every type by its task type.

``NODE_KINDS`` loads the node types' modules when first asked for, so that importing :mod:`.names` (flytekit's
start-up does) loads nothing else.
"""
from typing import Any


def __getattr__(name: str) -> Any:
    if name != "NODE_KINDS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .restart import RESTART
    from .restore import RESTORE
    from .scale import SCALE
    from .wait import WAIT

    kinds = {kind.task_type: kind for kind in (SCALE, WAIT, RESTART, RESTORE)}
    globals()["NODE_KINDS"] = kinds
    return kinds
