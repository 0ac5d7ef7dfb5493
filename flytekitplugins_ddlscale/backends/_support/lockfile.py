"""Exclusive ``fcntl`` locks on files in private folders, bounded in time.

A holder may remove the lock file as it releases it (``on_release``), so nothing stays on disk for a
cluster that does not exist: a waiter that then gets the lock sees the file is gone and starts again.
"""
import contextlib
import errno
import fcntl
import logging
import os
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from ...errors import ScalingError
from .privatefs import open_lock

LOCK_POLL = 0.05
"""Seconds between two tries of a lock another process holds."""
logger = logging.getLogger("flytekitplugins_ddlscale._core.records")


def _is_current(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (its last holder may have removed it)."""
    try:
        on_disk = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False


@contextlib.contextmanager
def exclusive(
    path: Path, timeout: float, busy: Callable[[], ScalingError], *, prepare: Optional[Callable[[], object]] = None,
    waiting: Optional[str] = None, on_release: Optional[Callable[[], None]] = None,
) -> Iterator[None]:
    """Hold the exclusive lock of the file at ``path`` (:func:`~.privatefs.open_lock`), waiting at
    most ``timeout`` seconds for another holder, then raising ``busy()``.

    ``prepare`` runs before each open (e.g. making the folder a previous holder removed); ``waiting``
    is logged once when the lock is busy; ``on_release`` runs under the lock as the block ends and
    may remove the lock file (an ``OSError`` it raises is logged, never raised over the block's).
    """
    deadline = time.monotonic() + timeout
    told = False
    while True:
        if prepare is not None:
            prepare()
        try:
            fd = open_lock(path)
        except FileNotFoundError:
            if prepare is None or time.monotonic() >= deadline:
                raise
            continue  # the folder went away between prepare and open: its holder removed it
        try:
            while not _try_lock(fd):
                if time.monotonic() >= deadline:
                    raise busy()
                if waiting and not told:
                    logger.info("%s", waiting)
                    told = True
                time.sleep(LOCK_POLL)
        except BaseException:
            os.close(fd)
            raise
        if _is_current(fd, path):
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            if on_release is not None:
                on_release()
        except OSError as exc:
            logger.debug("could not tidy up after the lock %s: %s", path, exc)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def remove_unused(lock_path: Path, in_use: Callable[[], bool]) -> None:
    """Remove ``lock_path`` unless ``in_use()`` (an ``on_release`` for locks of things that may not exist)."""
    if not in_use():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
