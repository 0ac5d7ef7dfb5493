"""Every scaling node type, listed once: what the connectors serve and the surfaces re-export."""
from typing import Dict

from .kinds import NodeKind
from .restart import RESTART
from .restore import RESTORE
from .scale import SCALE
from .wait import WAIT

NODE_KINDS: Dict[str, NodeKind] = {kind.task_type: kind for kind in (SCALE, WAIT, RESTART, RESTORE)}
"""Every node type by its task type."""

TASK_TYPES = tuple(NODE_KINDS)
"""Every task type this plugin defines."""
