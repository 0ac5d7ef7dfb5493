"""A backend for the length of a block, closed however the block ends."""
import contextlib
from typing import Iterator, Optional

from .backends import get_backend
from .backends.base import ClusterBackend


@contextlib.contextmanager
def open_backend(name: Optional[str]) -> Iterator[ClusterBackend]:
    """The backend ``name`` (or the environment's choice), closed on exit."""
    backend = get_backend(name)
    try:
        yield backend
    finally:
        backend.close()
