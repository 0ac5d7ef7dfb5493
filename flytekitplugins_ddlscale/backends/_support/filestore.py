"""Per-cluster JSON records in a private folder, shared by processes on one machine.

Updates happen under an exclusive ``fcntl`` lock and are written atomically,
so concurrent processes never lose one; a refused write raises
:class:`StateWriteError` and leaves no temp file (:mod:`.privatefs`).
"""
import contextlib
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, TypeVar, Union

from ..._core import settings
from ...errors import ConflictError
from .lockfile import exclusive, remove_unused
from .privatefs import private_dir, read_record_text, write_json, writing
from ..._core.records import json_object, reading
from ...refs import ClusterRef

T = TypeVar("T")
DEFAULT_LOCK_TIMEOUT = 300.0
"""Seconds to wait for another process's record lock when the caller gives no bound of its own: holders
read the records, decide and send one change (never a wait, never an outage ride-out)."""


def default_state_dir() -> Path:
    """``$DDLSCALE_STATE_DIR``, else ``~/.ddlscale``."""
    return Path(settings.STATE_DIR.value())


class FileRecordStore:
    """A directory of per-cluster JSON records with locked read-modify-write: a lock held elsewhere
    longer than ``lock_timeout`` is a :class:`ConflictError` naming it; an unsafe folder an
    :class:`UnsafePathError`; a record that is not a JSON object a :class:`CorruptRecordError`."""

    def __init__(self, directory: Union[str, Path, None] = None, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> None:
        if directory is None:
            directory = private_dir(default_state_dir()) / "records"
        self.directory = private_dir(directory)
        self.lock_timeout = lock_timeout

    def path(self, ref: ClusterRef) -> Path:
        """The file holding ``ref``'s record."""
        namespace = ref.namespace or "_"
        return self.directory / f"{namespace}.{ref.kind}.{ref.name}.json"

    @contextlib.contextmanager
    def _locked(self, ref: ClusterRef, timeout: Optional[float] = None) -> Iterator[Path]:
        path = self.path(ref)
        lock_path = path.with_suffix(".lock")
        timeout = self.lock_timeout if timeout is None else timeout

        def busy() -> ConflictError:
            return ConflictError(
                f"another process held the record lock of {ref} ({lock_path}) for more than "
                f"{timeout:g}s; if no ddlscale process is running for it, a stopped one holds it",
                cluster=str(ref),
            )

        # A cluster without a record keeps no lock file either (nothing is left for a name never used).
        with exclusive(
            lock_path, timeout, busy,
            waiting=f"waiting up to {timeout:g}s for the record lock of {ref} ({lock_path})",
            on_release=lambda: remove_unused(lock_path, path.exists),
        ):
            yield path

    @staticmethod
    def _load(path: Path) -> Dict[str, Any]:
        with reading(str(path)):
            try:
                text = read_record_text(path)
            except FileNotFoundError:
                return {}
            return json_object(text, "record")

    def read(self, ref: ClusterRef) -> Dict[str, Any]:
        """The record of ``ref`` (empty when there is none)."""
        with self._locked(ref) as path:
            return self._load(path)

    def update(self, ref: ClusterRef, change: Callable[[Dict[str, Any]], T], timeout: Optional[float] = None) -> T:
        """Apply ``change`` to the record under the lock (waiting at most ``timeout``, None:
        ``lock_timeout``) and save it; return what it returns. When it raises nothing is saved; an
        empty record deletes the file."""
        with self._locked(ref, timeout) as path:
            record = self._load(path)
            result = change(record)
            if record:
                write_json(path, record)
            else:
                with writing(path), contextlib.suppress(FileNotFoundError):
                    path.unlink()
            return result

    def remove(self, ref: ClusterRef) -> None:
        """Delete ``ref``'s record under the lock without reading it (a corrupt record too)."""
        with self._locked(ref) as path, writing(path), contextlib.suppress(FileNotFoundError):
            path.unlink()

    def get(self, ref: ClusterRef, key: str) -> Optional[Any]:
        """One field of the record, or None."""
        return self.read(ref).get(key)
