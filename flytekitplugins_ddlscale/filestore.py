"""Baselines and claims in files, shared by processes on one machine.

Used where the cluster object cannot carry annotations for us (the scaler
service only patches replicas) and by the local backend. Each cluster has a
JSON file; updates happen under an exclusive ``fcntl`` lock and are written
atomically (temp file + rename), so concurrent processes never lose an update.
"""
import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, TypeVar, Union

from .refs import ClusterRef

T = TypeVar("T")
STATE_DIR_ENV = "DDLSCALE_STATE_DIR"


def default_state_dir() -> Path:
    """``$DDLSCALE_STATE_DIR``, else ``~/.ddlscale``."""
    return Path(os.environ.get(STATE_DIR_ENV) or Path.home() / ".ddlscale")


class FileRecordStore:
    """A directory of per-cluster JSON records with locked read-modify-write."""

    def __init__(self, directory: Union[str, Path, None] = None) -> None:
        self.directory = Path(directory) if directory is not None else default_state_dir() / "records"
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, ref: ClusterRef) -> Path:
        namespace = ref.namespace or "_"
        return self.directory / f"{namespace}.{ref.kind}.{ref.name}.json"

    @contextlib.contextmanager
    def _locked(self, ref: ClusterRef) -> Iterator[Path]:
        path = self._path(ref)
        with open(path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield path
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @staticmethod
    def _load(path: Path) -> Dict[str, Any]:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}

    def read(self, ref: ClusterRef) -> Dict[str, Any]:
        """The record of ``ref`` (empty when there is none)."""
        with self._locked(ref) as path:
            return self._load(path)

    def update(self, ref: ClusterRef, change: Callable[[Dict[str, Any]], T]) -> T:
        """Apply ``change`` to the record in place, under the lock, and save it.

        Returns what ``change`` returns. An empty record deletes the file.
        """
        with self._locked(ref) as path:
            record = self._load(path)
            result = change(record)
            if record:
                fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(record, handle, sort_keys=True)
                os.replace(tmp, path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            return result

    def get(self, ref: ClusterRef, key: str) -> Optional[Any]:
        """One field of the record, or None."""
        return self.read(ref).get(key)
