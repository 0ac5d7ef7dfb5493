"""Backends for the length of a block: opened and closed per use, or kept open for a service's polls; and a
cluster's connection variables set for a block (:func:`connected`)."""
import contextlib
import hashlib
import os
import threading
from collections import OrderedDict
from typing import Dict, Iterator, Optional, Tuple, Union

from .._core.lifetime import environ_set
from ..backends import backend_name_from_env, get_backend
from ..backends._base import ClusterBackend
from ..refs import ClusterRef, cluster_text, parse_cluster

KEPT_BACKENDS = 8
"""Open backends a :class:`BackendPool` keeps at most (one per backend name and environment)."""


@contextlib.contextmanager
def open_backend(name: Optional[str]) -> Iterator[ClusterBackend]:
    """The backend ``name`` (or the environment's choice), closed on exit."""
    backend = get_backend(name)
    try:
        yield backend
    finally:
        backend.close()


@contextlib.contextmanager
def connected(cluster: Union[str, ClusterRef], backend: Optional[str] = None) -> Iterator[Dict[str, str]]:
    """The variables Domino injects into a run (``DASK_SCHEDULER_SERVICE_HOST`` ...) for ``cluster``, as its
    backend offers them (``connection_env``: the local one does), present in the block and put back on
    exit, so code written for Domino runs unchanged; yields those set (none where they are set already)."""
    ref = parse_cluster(cluster_text(cluster))
    with open_backend(backend) as chosen:
        values = dict(chosen.connection_env(ref))
    with environ_set(values) as present:
        yield present


def _environment_digest() -> str:
    """A digest of this process's environment: it may hold credentials, which a key must not show."""
    return hashlib.sha256(repr(sorted(os.environ.items())).encode()).hexdigest()


class _Kept:
    """One open backend of a pool and how many blocks are using it now."""

    def __init__(self, backend: ClusterBackend) -> None:
        self.backend = backend
        self.users = 0


class BackendPool:
    """Open backends kept for reuse across calls by a long-lived service (the connector): one per backend
    name and process environment (which configures it: ``KUBECONFIG``, ``DDLSCALE_*``), so polls share one
    client and its connections; at most ``size``, the least recently used idle one closed to make room.
    Every built-in backend is safe to call from several threads at once."""

    def __init__(self, size: int = KEPT_BACKENDS) -> None:
        self.size = size
        self._kept: "OrderedDict[Tuple[str, str], _Kept]" = OrderedDict()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def backend(self, name: Optional[str]) -> Iterator[ClusterBackend]:
        """The kept backend ``name`` (or the environment's choice), opened on first use; not closed on exit."""
        with self._using(name, True) as backend:
            assert backend is not None
            yield backend

    @contextlib.contextmanager
    def kept(self, name: Optional[str]) -> Iterator[Optional[ClusterBackend]]:
        """The kept backend ``name`` if it is open already, else None: nothing is opened (a caller that must
        not block, an event loop, reads it only where an earlier call opened it)."""
        with self._using(name, False) as backend:
            yield backend

    @contextlib.contextmanager
    def _using(self, name: Optional[str], opening: bool) -> Iterator[Optional[ClusterBackend]]:
        key = ((name or backend_name_from_env()).strip().lower(), _environment_digest())
        with self._lock:
            kept = self._kept.get(key)
            if kept is None and opening:
                kept = self._kept[key] = _Kept(get_backend(key[0]))
            if kept is not None:
                self._kept.move_to_end(key)
                kept.users += 1
                self._evict_idle()
        if kept is None:
            yield None
            return
        try:
            yield kept.backend
        finally:
            with self._lock:
                kept.users -= 1
                self._evict_idle()

    def close(self) -> None:
        """Close every kept backend that no block is using, and forget it."""
        with self._lock:
            idle = [key for key, kept in self._kept.items() if kept.users == 0]
            closing = [self._kept.pop(key).backend for key in idle]
        for backend in closing:
            backend.close()

    def __len__(self) -> int:
        return len(self._kept)

    def _evict_idle(self) -> None:
        """Close least recently used idle backends while more than ``size`` are kept (lock held)."""
        for key in [key for key, kept in self._kept.items() if kept.users == 0]:
            if len(self._kept) <= self.size:
                return
            self._kept.pop(key).backend.close()
