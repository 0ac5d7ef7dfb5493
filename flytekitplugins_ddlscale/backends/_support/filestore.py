"""Baselines and claims in files, shared by processes on one machine.

Used where the cluster object cannot carry annotations for us (the scaler
service only patches replicas) and by the local backend. Each cluster has a
JSON file; updates happen under an exclusive ``fcntl`` lock and are written
atomically (temp file + rename), so concurrent processes never lose an update;
a write the folder or the disk refuses raises :class:`StateWriteError` and
leaves no temp file.
The directory is private (:func:`~.privatefs.private_dir`) and no file in it
is opened through a symbolic link.
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
    """A directory of per-cluster JSON records with locked read-modify-write.

    Waiting for a lock that another process holds is bounded by
    ``lock_timeout`` seconds, then :class:`ConflictError` names the lock file.
    The directory is created 0700; one owned by another user, writable by
    group or others, or a symbolic link raises :class:`UnsafePathError`. A
    record that is not a JSON object raises :class:`CorruptRecordError`.
    """

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
        """Apply ``change`` to the record in place, under the lock, and save it.

        Waits at most ``timeout`` seconds for the lock (None: ``lock_timeout``).
        Returns what ``change`` returns; when it raises, nothing is saved. An
        empty record deletes the file. A record that cannot be written raises
        :class:`StateWriteError` naming it (no temp file is left).
        """
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
