"""Writing state files: atomically, and a failed write is a typed answer that leaves nothing behind.

Records and cluster files are replaced through a temp file and a rename, so
readers see the old file or the new one, never half of one. When the folder
is read-only, the disk is full or the write is refused otherwise, the temp
file is removed and :class:`StateWriteError` names the file and the remedy,
instead of an ``OSError`` traceback and a ``.tmp-*`` file left behind.
"""
import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

from ...errors import StateWriteError
from .privatefs import open_nofollow

TEMP_PREFIX = ".tmp-"


@contextlib.contextmanager
def writing(path: Any) -> Iterator[None]:
    """Inside the block, an ``OSError`` (read-only folder, full disk, permission) raises
    :class:`StateWriteError` naming ``path``."""
    try:
        yield
    except OSError as exc:
        raise StateWriteError.from_os_error(path, exc) from None


def write_json(path: Path, data: Any, indent: Optional[int] = None) -> None:
    """Replace ``path`` with ``data`` as JSON (sorted keys) atomically; :class:`StateWriteError` when it
    cannot be written, with no temp file left."""
    with writing(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, indent=indent, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def open_lock(path: Path) -> int:
    """A descriptor of the lock file ``path`` to ``flock`` (created 0600 if absent, never through a link).

    On a read-only folder or file system an existing lock file is opened read-only (``flock`` needs no
    write access), so what only reads or stops processes (``down``) still works there;
    ``FileNotFoundError`` when the folder is gone (its last lock holder may have removed it: the caller
    makes it again); :class:`StateWriteError` when it cannot be opened otherwise.
    """
    try:
        return open_nofollow(path, os.O_RDWR | os.O_CREAT)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC) or not os.path.exists(path):
            raise StateWriteError.from_os_error(path, exc) from None
    with writing(path):
        return open_nofollow(path, os.O_RDONLY)
