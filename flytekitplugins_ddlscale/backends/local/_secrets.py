"""Secret files of a local cluster: random, 0600, in the cluster's private folder, never through a link.

A cluster's processes and its clients read a secret from its file (Ray's
token, Spark's shared secret, Dask's private key), so it never appears on a
command line (``/proc/PID/cmdline`` is world-readable) or in an environment
another user's process can see.
"""
import os
import secrets
import tempfile
from pathlib import Path

from ...errors import UnsafePathError
from .._support.privatefs import private_dir, read_text_nofollow


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with a 0600 file holding ``data`` (atomically: readers see the old or the new
    file whole); its folder is made private (0700) and checked first."""
    folder = private_dir(path.parent)
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def fresh_secret(path: Path) -> str:
    """A new random secret (256 bits, hex) written to ``path`` in place of any older one."""
    value = secrets.token_hex(32)
    write_private(path, value.encode("ascii"))
    return value


def kept_secret(path: Path) -> str:
    """The secret in ``path``, made (:func:`fresh_secret`) when there is none; a file that is a link,
    another user's or readable by others raises :class:`UnsafePathError`."""
    if not os.path.lexists(path):
        return fresh_secret(path)
    check_own_private_file(path)
    value = read_text_nofollow(path).strip()
    return value or fresh_secret(path)


def check_own_private_file(path: Path) -> None:
    """Refuse a secret file that is a link, not a regular file, another user's, or readable by others."""
    found = os.lstat(path)
    if os.path.islink(path) or not os.path.isfile(path) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise UnsafePathError(
            path, "a local cluster's secret file is a link, not a file, another user's or readable by others",
            "take the cluster down (`ddlscale local down`) and start it again",
        )
