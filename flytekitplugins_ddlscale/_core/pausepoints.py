"""Named points where a phase or a local change can be stopped on purpose, to crash it at a chosen moment.

``DDLSCALE_PAUSE_AT=<point>=<file>`` makes a process that reaches ``<point>``
write ``<point> <pid>`` to ``<file>`` and wait there until the file is
removed (at most :data:`MAX_PAUSE` seconds) instead of going on. The reliability tests use it
to ``kill -9`` a phase exactly after its claim, or with the cluster scaled,
and a local cluster's change with a process started but not yet recorded,
not by luck of timing; an operator can use it to rehearse a crash. Unset, it
costs one environment lookup per point.
"""
import logging
import os
import time
from pathlib import Path

from . import settings

logger = logging.getLogger("flytekitplugins_ddlscale")

MAX_PAUSE = 600.0
_RESUME_POLL = 0.05


def check_pause_setting() -> None:
    """Refuse a malformed ``$DDLSCALE_PAUSE_AT`` before the phase changes anything."""
    settings.PAUSE_AT.value()


def pause_point(name: str) -> None:
    """Pause here when ``$DDLSCALE_PAUSE_AT`` names this point."""
    # Read raw, not checked: a malformed value was refused before the phase began, and a local change
    # under its cluster's lock is no place to fail on it.
    setting = settings.PAUSE_AT.raw()
    if not setting:
        return
    point, _, path = setting.partition("=")
    if point != name:
        return
    logger.warning(
        "paused at %r (%s); it goes on when %s is removed, or after %.0fs", name, settings.PAUSE_AT.name, path, MAX_PAUSE
    )
    marker = Path(path)
    marker.write_text(f"{name} {os.getpid()}\n", encoding="utf-8")
    ends = time.monotonic() + MAX_PAUSE
    while marker.exists() and time.monotonic() < ends:
        time.sleep(_RESUME_POLL)
