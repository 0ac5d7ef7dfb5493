"""Private folders and files of the state directory: only this user can change them, no link is followed.

Records decide which processes start and which files ``down`` removes, so every
folder is created 0700 and checked before use, every file opened with
``O_NOFOLLOW``; a file is replaced atomically, and a refused write is a
:class:`StateWriteError` naming it, with no temp file left behind.
"""
import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from ...errors import InvalidInputError, StateWriteError, UnsafePathError

PathLike = Union[str, Path]
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
TEMP_PREFIX = ".tmp-"


def private_dir(path: PathLike) -> Path:
    """``path`` as a folder only this user can change, created 0700 (with missing parents) if absent;
    :class:`UnsafePathError` as :func:`check_private_dir` says for it or a parent created here,
    :class:`StateWriteError` when it cannot be created (read-only parent, full disk)."""
    folder = Path(path)
    missing = []
    probe = folder
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for created in reversed(missing):
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(created, 0o700)
        except OSError as exc:
            raise StateWriteError.from_os_error(created, exc) from None
        check_private_dir(created)
    check_private_dir(folder)
    return folder


def check_private_dir(path: PathLike) -> None:
    """Raise :class:`UnsafePathError` unless ``path`` is a real folder of this user, not writable by others."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise UnsafePathError(path, "it vanished while it was being checked", "run the command again") from None
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(path, "it is a symbolic link", "remove the link; ddlscale creates the folder itself")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePathError(path, "it is not a folder", "remove it or choose another state directory")
    if info.st_uid != os.geteuid():
        raise UnsafePathError(
            path, f"it is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})",
            "choose a state directory of your own ($DDLSCALE_STATE_DIR or --state-dir)",
        )
    if info.st_mode & _OTHERS_WRITE:
        mode = stat.S_IMODE(info.st_mode)
        raise UnsafePathError(path, f"group or others may write to it (mode {mode:04o})", f"chmod go-w {path}")


def open_nofollow(path: PathLike, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` (:class:`UnsafePathError`); new files get ``mode``."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(path, "it is a symbolic link", "remove the link; ddlscale writes the file itself") from None
        raise


def read_text_nofollow(path: PathLike) -> str:
    """The UTF-8 text of the file at ``path`` (not through a link); ``FileNotFoundError`` when absent."""
    with os.fdopen(open_nofollow(path, os.O_RDONLY), encoding="utf-8", errors="replace") as handle:
        return handle.read()


RECORD_MAX_BYTES = 1 << 20
"""The largest record read back (ddlscale writes a few KB; a bigger file was not written by it)."""


def read_record_text(path: PathLike, max_bytes: int = RECORD_MAX_BYTES, own: bool = False) -> str:
    """The UTF-8 text of the record file at ``path``, read without ever blocking (a FIFO is never read).
    ``FileNotFoundError`` when absent; :class:`UnsafePathError` for a link; :class:`InvalidInputError` naming
    the file for anything but a regular file, one over ``max_bytes``, not UTF-8, or (``own``) not this user's."""
    name = os.path.basename(path)
    allowed = f"a regular file of at most {max_bytes} bytes of UTF-8 text, as ddlscale writes it"
    handle = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInputError(name, "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file", allowed)
        if own and info.st_uid != os.geteuid():
            # Checked on the open file, so the file read is the file checked.
            raise InvalidInputError(name, f"owned by uid {info.st_uid}", f"{allowed}, owned by you (uid {os.geteuid()})")
        chunks = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(handle, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(handle)
    if len(data) > max_bytes:
        raise InvalidInputError(name, f"over {max_bytes} bytes", allowed)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(name, f"not UTF-8 at byte {exc.start}", allowed) from None


def remove_nofollow(path: PathLike) -> None:
    """Remove ``path``: a link or file is unlinked (never its target); a folder is removed with what it
    holds, walking without following links. Nothing happens when ``path`` does not exist."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        # shutil.rmtree works on descriptors here (rmtree.avoids_symlink_attacks): links are unlinked, not followed.
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


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
    """A descriptor of the lock file ``path`` to ``flock`` (created 0600 if absent, never through a link);
    read-only where it cannot be written (``flock`` needs no write access, so ``down`` still works there).
    ``FileNotFoundError`` when the folder is gone (the caller makes it again); else :class:`StateWriteError`."""
    try:
        return open_nofollow(path, os.O_RDWR | os.O_CREAT)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC) or not os.path.exists(path):
            raise StateWriteError.from_os_error(path, exc) from None
    with writing(path):
        return open_nofollow(path, os.O_RDONLY)
