"""Which framework driver runs a local cluster of each kind.

Drivers are imported when a cluster of their kind is first used, so a
laptop with only Dask installed never imports Ray or Spark code. A driver
whose framework is not installed raises, on construction, an error that
says what to install; a kind this platform does not run is refused first
(:func:`check_platform`).
"""
import importlib
import sys
from typing import Dict, FrozenSet, Optional

from ...errors import UnsupportedOperationError
from ._driver import FrameworkDriver

_DRIVERS: Dict[str, str] = {
    "dask": "flytekitplugins_ddlscale.backends.local._dask_driver:DaskDriver",
    "ray": "flytekitplugins_ddlscale.backends.local._ray_driver:RayDriver",
    "spark": "flytekitplugins_ddlscale.backends.local._spark_driver:SparkDriver",
}
"""Kind -> ``module:class`` of its driver."""

SERVED_KINDS: FrozenSet[str] = frozenset(_DRIVERS)
"""The cluster kinds the local backend runs."""

PLATFORM_KINDS: Dict[str, FrozenSet[str]] = {"linux": SERVED_KINDS, "darwin": frozenset({"dask", "spark"})}
"""The kinds the local backend runs on each platform it supports (by ``sys.platform``: Linux, macOS), reading
processes through ``psutil``. Ray is Linux's alone: its worker nodes die with their wrapper through ``prctl``,
and its token goes only to a listener ``/proc/net/tcp`` shows is this user's (``_core/peerowner.py``)."""


def check_platform(platform: str, kind: Optional[str] = None) -> None:
    """:class:`UnsupportedOperationError` (one line naming ``platform`` and what runs where) unless the local
    backend runs on ``platform`` (a ``sys.platform`` value), and runs clusters of ``kind`` there if given."""
    kinds = PLATFORM_KINDS.get(platform, frozenset())
    if not kinds or (kind is not None and kind not in kinds):
        runs = "; ".join(f"{name}: {', '.join(sorted(served))}" for name, served in PLATFORM_KINDS.items())
        what = f"{kind} clusters on" if kinds else "on"
        raise UnsupportedOperationError(f"the local backend does not run {what} {platform} (it runs {runs})")


def load_driver(kind: str) -> FrameworkDriver:
    """A new driver for local clusters of ``kind`` (one of :data:`SERVED_KINDS`), refused first on a
    platform that does not run it (:func:`check_platform`)."""
    check_platform(sys.platform, kind)
    module_name, class_name = _DRIVERS[kind].split(":")
    driver_class = getattr(importlib.import_module(module_name), class_name)
    driver: FrameworkDriver = driver_class()
    return driver


def served_frameworks() -> str:
    """The served kinds as a message names them: ``dask, ray and spark``."""
    kinds = sorted(SERVED_KINDS)
    return kinds[0] if len(kinds) == 1 else f"{', '.join(kinds[:-1])} and {kinds[-1]}"
