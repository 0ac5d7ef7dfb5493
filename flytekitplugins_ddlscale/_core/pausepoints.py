"""Named points in a phase and in a local change where a test can stop the process on purpose.

A point is a call of :func:`pause_point`. It does nothing unless code running
in the same process added a hook (:func:`add_pause_hook`): nothing in the
environment, a file or a setting can switch one on, so a build a user runs
never pauses and never writes anywhere on a point's account. The crash tests
run ``ddlscale`` through a launcher of their own (``tests/pause_support.py``)
that adds a hook, so they can ``kill -9`` a phase exactly after its claim, or
with the cluster scaled, or a local change with a process started but not yet
recorded, not by luck of timing.

Points: ``claimed`` (the claim is recorded, nothing scaled yet), ``scaled``
(the cluster holds the claim and the body is about to run), ``released`` (the
claim is dropped, the cluster not yet given back), and, in the local backend
under the cluster's lock, ``head-started`` and ``worker-started`` (a head or
worker process runs that ``cluster.json`` does not hold yet).
"""
import threading
from typing import Callable, List

PAUSE_POINTS = ("claimed", "scaled", "released", "head-started", "worker-started")
"""Every point's name, in the order a phase meets them (the local ones inside a change)."""

PauseHook = Callable[[str], None]
_hooks: List[PauseHook] = []
_lock = threading.Lock()


def add_pause_hook(hook: PauseHook) -> Callable[[], None]:
    """Call ``hook(point)`` at every point this process reaches from now on; returns what removes it."""
    with _lock:
        _hooks.append(hook)

    def remove() -> None:
        with _lock:
            if hook in _hooks:
                _hooks.remove(hook)

    return remove


def pause_point(name: str) -> None:
    """The point ``name`` (one of :data:`PAUSE_POINTS`): each hook added in this process is called."""
    with _lock:
        hooks = list(_hooks)
    for hook in hooks:
        hook(name)
