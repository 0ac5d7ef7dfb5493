"""What an interrupted node-based local flow leaves running, and how to stop it: each node that changes a
cluster in this process is remembered (:func:`remember`); each surface's interrupt hook calls
:func:`report_left_running`.
"""
import sys
import threading
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Type

from ...errors import ClusterNotFoundError
from ...refs import ClusterRef
from ..._core.progress import plural

if TYPE_CHECKING:
    from ...backends._base import ClusterBackend

_touched: Dict[str, Tuple[str, ClusterRef]] = {}
_lock = threading.Lock()


def remember(backend: Optional[str], ref: ClusterRef) -> None:
    """Note that this process is changing ``ref`` through ``backend`` (None: the environment's choice, resolved
    now); called before the change, so an interrupt during the node's own wait is covered too."""
    from ...backends import backend_name_from_env

    with _lock:
        _touched[str(ref)] = (backend or backend_name_from_env(), ref)


def forget_all() -> None:
    """Forget every remembered cluster (a new flow run in the same process starts from none)."""
    with _lock:
        _touched.clear()


def stop_command(backend: str, ref: ClusterRef) -> str:
    """The ``ddlscale`` command that stops (or restores) ``ref`` on ``backend``, as the backend says it."""
    return _backend_class(backend).stop_command(ref)


def left_running() -> List[str]:
    """One line per remembered cluster that may still hold workers, with the command that stops it. Only a
    backend that ``reads_locally`` is read (a Ctrl-C report must not wait on a service); the others' clusters
    are listed as possibly still scaled."""
    with _lock:
        touched = list(_touched.values())
    lines = []
    for name, ref in touched:
        backend_class = _backend_class(name)
        command = backend_class.stop_command(ref)
        if not backend_class.capabilities.reads_locally:
            lines.append(f"  {ref} ({name} backend): may still be scaled; to restore it: {command}")
            continue
        backend = backend_class()
        try:
            state = backend.get_state(ref)
        except ClusterNotFoundError:
            continue
        except Exception as exc:  # the report must not hide the interrupt itself
            lines.append(f"  {ref}: state unknown ({type(exc).__name__}); to stop it: {command}")
            continue
        finally:
            backend.close()
        if state.desired_workers > 0 or state.status in ("Running", "Starting", "Pending"):
            lines.append(f"  {ref}: {state.status}, {plural(state.desired_workers, 'worker')}; to stop it: {command}")
    return lines


def _backend_class(name: str) -> Type["ClusterBackend"]:
    """The class of backend ``name`` (importing its module only, which opens nothing)."""
    from ...backends import load_backend_class

    return load_backend_class(name)


def report_left_running() -> None:
    """Print what the interrupted flow left running (nothing when all is stopped)."""
    lines = left_running()
    if lines:
        sys.stderr.write("ddlscale: interrupted; left running by this flow:\n" + "\n".join(lines) + "\n")
        sys.stderr.flush()
