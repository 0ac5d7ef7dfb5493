"""What a node-based local flow leaves running when it is interrupted, and how to stop it.

Nodes scale a cluster in one task and expect a later node to scale it
down; Ctrl-C in between leaves it running. Each node that changed a
cluster remembers it here, and on SIGINT (through flytekit's own
signal-handler hook, which then exits) the clusters still running are
listed with the command that stops them.
"""
import sys
import threading
from typing import Dict, List, Optional, Tuple

from ..errors import ClusterNotFoundError
from ..refs import ClusterRef

_touched: Dict[str, Tuple[Optional[str], ClusterRef]] = {}
_lock = threading.Lock()
_installed = False


def remember(backend: Optional[str], ref: ClusterRef) -> None:
    """Note that this process is changing ``ref`` through ``backend`` (None: the environment's choice).

    Called before the change, so an interrupt during the node's own wait is
    covered too. Installs the Ctrl-C report once.
    """
    global _installed
    with _lock:
        _touched[str(ref)] = (backend, ref)
        if _installed:
            return
        _installed = True
    from flytekit.core.context_manager import FlyteContextManager

    FlyteContextManager.add_signal_handler(lambda signum, frame: report_left_running())


def stop_command(backend: str, ref: ClusterRef) -> str:
    """The ``ddlscale`` command that stops (or restores) ``ref`` on ``backend``."""
    if backend == "local":
        return f"ddlscale local down --name {ref.name}"
    namespace = f" --namespace {ref.namespace}" if ref.namespace else ""
    return f"ddlscale restore --backend {backend} --kind {ref.kind} --name {ref.name}{namespace}"


def left_running() -> List[str]:
    """One line per remembered cluster that still has workers or a running head, with its stop command."""
    from ..backends import get_backend

    with _lock:
        touched = list(_touched.values())
    lines = []
    for option, ref in touched:
        backend_name = option or "the environment's backend"
        try:
            backend = get_backend(option)
            backend_name = backend.name
            try:
                state = backend.get_state(ref)
            finally:
                backend.close()
        except ClusterNotFoundError:
            continue
        except Exception as exc:  # the report must not hide the interrupt itself
            lines.append(f"  {ref}: state unknown ({type(exc).__name__}); to stop it: {stop_command(backend_name, ref)}")
            continue
        if state.desired_workers > 0 or state.status in ("Running", "Starting", "Pending"):
            lines.append(
                f"  {ref}: {state.status}, {state.desired_workers} worker(s); to stop it: "
                f"{stop_command(backend_name, ref)}"
            )
    return lines


def report_left_running() -> None:
    """Print what the interrupted flow left running (nothing when all is stopped)."""
    lines = left_running()
    if lines:
        sys.stderr.write("ddlscale: interrupted; left running by this flow:\n" + "\n".join(lines) + "\n")
        sys.stderr.flush()
