"""The Ctrl-C report of the flytekit nodes: clusters a local flow left running (see :mod:`.._services.nodes.leftovers`).

Each flytekit node that changes a cluster calls :func:`remember`; the first
call hooks the report into flytekit's own signal-handler hook, which runs it
on SIGINT and then exits.
"""
import threading
from typing import Optional

from .._services.nodes.leftovers import forget_all, left_running, report_left_running, stop_command
from .._services.nodes.leftovers import remember as remember_cluster
from ..refs import ClusterRef

__all__ = ["forget_all", "left_running", "remember", "report_left_running", "stop_command"]

_lock = threading.Lock()
_installed = False


def remember(backend: Optional[str], ref: ClusterRef) -> None:
    """Note that this process is changing ``ref`` through ``backend``; installs the Ctrl-C report once."""
    global _installed
    remember_cluster(backend, ref)
    with _lock:
        if _installed:
            return
        _installed = True
    from flytekit.core.context_manager import FlyteContextManager

    FlyteContextManager.add_signal_handler(lambda signum, frame: report_left_running())
