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

from .errors import StateWriteError

TEMP_PREFIX = ".tmp-"


@contextlib.contextmanager
def writing(path: Any) -> Iterator[None]:
    """Inside the block, an ``OSError`` (read-only folder, full disk, permission) raises
    :class:`StateWriteError` naming ``path``."""
    try:
        yield
    except OSError as exc:
        raise StateWriteError(path, _problem(exc)) from None


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


def _problem(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return "no space left on the device (disk or quota full)"
    if exc.errno == errno.EROFS:
        return "the file system is read-only"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (the folder is not writable)"
    return exc.strerror or type(exc).__name__
