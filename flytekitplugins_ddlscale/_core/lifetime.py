"""What lasts for a block or until the process ends: objects a ``with`` closes, exit hooks registered
once, environment variables set for a block, and the named points where a test may stop a run."""
import atexit
import contextlib
import os
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Mapping, Set, TypeVar

C = TypeVar("C", bound="Closing")
_at_exit: Set[Callable[[], None]] = set()
_at_exit_lock = threading.Lock()


def at_exit_once(func: Callable[[], None]) -> None:
    """Run ``func`` when the interpreter exits; registered the first time it is asked for, so the hook
    exists only in a process that started what it ends (never because a module was imported)."""
    with _at_exit_lock:
        if func not in _at_exit:
            _at_exit.add(func)
            atexit.register(func)


class Closing:
    """``with`` gives the object itself and calls its ``close()`` when the block ends, however it ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: C) -> C:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextlib.contextmanager
def environ_set(values: Mapping[str, str]) -> Iterator[Dict[str, str]]:
    """Set ``values`` in ``os.environ`` for the block, and restore what was there at its end. Dask reads
    ``DASK_*`` once, when imported: those of ``values`` also go into an imported Dask's configuration for the
    block, and a Dask first imported inside it reads its configuration again at the end."""
    saved = {key: os.environ.get(key) for key in values}
    dask_before = "dask.config" in sys.modules
    os.environ.update(values)
    try:
        with _dask_config_set(values):
            yield dict(values)
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        config = sys.modules.get("dask.config")
        if config is not None and not dask_before and any(key.startswith("DASK_") for key in values):
            config.refresh()


def _dask_config_set(values: Mapping[str, str]) -> "contextlib.AbstractContextManager[Any]":
    """``dask.config.set`` of the ``DASK_*`` entries of ``values`` when Dask is imported, else nothing."""
    dask_values = {key: value for key, value in values.items() if key.startswith("DASK_")}
    config = sys.modules.get("dask.config")
    if config is None or not dask_values:
        return contextlib.nullcontext()
    return config.set(_dotted(config.collect_env(dask_values)))  # type: ignore[no-any-return]


def _dotted(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``: ``dask.config.set`` replaces a whole subtree given a mapping."""
    flat: Dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_dotted(value, name + "."))
        else:
            flat[name] = value
    return flat


PAUSE_POINTS = ("claimed", "scaled", "released", "head-started", "worker-started")
"""Where a test may stop a run, in the order a phase meets them (``head-started``/``worker-started``: in a
local change, a process ``cluster.json`` does not hold yet). Only a hook added in the same process acts on
a point (``tests/pause_support.py``): nothing in the environment or a file can switch one on."""

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
