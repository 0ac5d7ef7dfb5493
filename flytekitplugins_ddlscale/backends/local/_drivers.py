"""Which framework driver runs a local cluster of each kind.

Drivers are imported when a cluster of their kind is first used, so a
laptop with only Dask installed never imports Ray or Spark code. A driver
whose framework is not installed raises, on construction, an error that
says what to install.
"""
import importlib
from typing import Dict, FrozenSet

from ._driver import FrameworkDriver

_DRIVERS: Dict[str, str] = {
    "dask": "flytekitplugins_ddlscale.backends.local._dask_driver:DaskDriver",
    "ray": "flytekitplugins_ddlscale.backends.local._ray_driver:RayDriver",
    "spark": "flytekitplugins_ddlscale.backends.local._spark_driver:SparkDriver",
}
"""Kind -> ``module:class`` of its driver."""

SERVED_KINDS: FrozenSet[str] = frozenset(_DRIVERS)
"""The cluster kinds the local backend runs."""


def load_driver(kind: str) -> FrameworkDriver:
    """A new driver for local clusters of ``kind`` (one of :data:`SERVED_KINDS`)."""
    module_name, class_name = _DRIVERS[kind].split(":")
    driver_class = getattr(importlib.import_module(module_name), class_name)
    driver: FrameworkDriver = driver_class()
    return driver


def served_frameworks() -> str:
    """The served kinds as a message names them: ``dask, ray and spark``."""
    kinds = sorted(SERVED_KINDS)
    return kinds[0] if len(kinds) == 1 else f"{', '.join(kinds[:-1])} and {kinds[-1]}"
