"""Preloaded into every local Dask scheduler (``--preload <this file>``): it closes itself once its cluster is gone.

A scheduler that no record holds (its cluster's folder or ``cluster.json``
removed, or the record naming another scheduler, for :data:`GRACE` seconds
in a row) would otherwise run until someone finds it: Dask schedulers have no
death timeout, and ``--idle-timeout`` would also end a cluster kept up on
purpose. The cluster's folder comes from the scheduler's environment
(``DDLSCALE_LOCAL_CLUSTER``, set by :func:`~.procs.spawn_detached`). A record
that cannot be read (damaged by hand) is not a verdict: the scheduler stays.
Its workers follow it through their ``--death-timeout``.

Loaded by path, not as a module of this package: it imports nothing but the
standard library and what the scheduler already has loaded.
"""
import asyncio
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any, Optional

MARK_ENV = "DDLSCALE_LOCAL_CLUSTER"
_MAX_RECORD_BYTES = 1 << 20
CHECK_EVERY = 2.0
"""Seconds between two looks at the record."""
GRACE = float(os.environ.get("DDLSCALE_WATCH_GRACE", "30"))
"""Seconds the record must go on not holding this scheduler before it closes: the one who starts a
scheduler records it right after, so only a start that was killed half-way leaves it unrecorded."""
logger = logging.getLogger("distributed.scheduler")


def recorded_here(folder: Path, pid: int) -> Optional[bool]:
    """True when ``folder``'s ``cluster.json`` names ``pid`` as its scheduler; False when the folder or
    the record is gone or names another; None when the record cannot be read."""
    try:
        # Non-blocking, no link, a regular file only, a bounded read: a FIFO or a folder put in the record's
        # place must not stall the scheduler's event loop.
        handle = os.open(folder / "cluster.json", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    with os.fdopen(handle, "rb") as stream:
        try:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                return None
            text = stream.read(_MAX_RECORD_BYTES + 1)
        except OSError:
            return None
    try:
        data = json.loads(text) if len(text) <= _MAX_RECORD_BYTES else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or "scheduler" not in data:
        # Not a record ddlscale wrote (it always writes the field, null without a head): no verdict.
        return None
    scheduler = data.get("scheduler")
    return isinstance(scheduler, dict) and scheduler.get("pid") == pid


def dask_setup(scheduler: Any) -> None:
    """Start the watch (a periodic callback the scheduler stops when it closes)."""
    from tornado.ioloop import PeriodicCallback

    mark = os.environ.get(MARK_ENV)
    if not mark:
        return
    folder = Path(mark)
    unrecorded_since: list = []

    def check() -> None:
        if recorded_here(folder, os.getpid()) is not False:
            unrecorded_since.clear()
            return
        if not unrecorded_since:
            unrecorded_since.append(time.monotonic())
        if time.monotonic() - unrecorded_since[0] >= GRACE:
            logger.warning("closing: no record of cluster %s holds this scheduler (for %.0fs)", folder, GRACE)
            scheduler.periodic_callbacks.pop("ddlscale-watch").stop()
            asyncio.ensure_future(scheduler.close(reason="its local cluster's record no longer holds it"))

    scheduler.periodic_callbacks["ddlscale-watch"] = PeriodicCallback(check, CHECK_EVERY * 1000)
