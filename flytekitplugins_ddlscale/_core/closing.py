"""Objects a ``with`` block closes (``with get_backend() as backend:``, ``with reporter:``), and what
ends before the interpreter does."""
import atexit
import threading
from typing import Callable, Set, TypeVar

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
