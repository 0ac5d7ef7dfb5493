"""The newest resourceVersion this process wrote or read of each cluster object, for another process.

A connector replica that sends a change hands the version its write left
to the replica that answers the node's next poll (in the node's metadata),
which then trusts its own cache for that object only from that version on
(:func:`~._informer.expect_version`). Kept for the most recently touched
objects only: a create reads it right after its own write.
"""
import threading
from collections import OrderedDict
from typing import Tuple

from ._informer import at_least

KEPT = 4096
"""Objects whose version is kept before the least recently touched is forgotten."""

ObjectKey = Tuple[str, str, str]
"""(namespace, plural, name) of one object."""


class VersionsSeen:
    """Per object, the newest version written or read; thread-safe, bounded to :data:`KEPT` objects."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: "OrderedDict[ObjectKey, str]" = OrderedDict()

    def saw(self, key: ObjectKey, version: str) -> None:
        """The object ``key`` was written or read at ``version`` ('' is ignored)."""
        if not version:
            return
        with self._lock:
            known = self._versions.pop(key, "")
            self._versions[key] = known if known and at_least(known, version) else version
            while len(self._versions) > KEPT:
                self._versions.popitem(last=False)

    def newest(self, key: ObjectKey) -> str:
        """The newest version of ``key`` written or read, '' where none is kept."""
        with self._lock:
            return self._versions.get(key, "")
