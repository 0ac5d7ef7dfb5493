"""What a hardware tier means for a local worker process: ``cores`` becomes a Dask worker's ``--nthreads``
(a Spark worker's ``--cores``, a Ray node's ``--num-cpus``), ``memory`` its memory. Tiers come from
``data/local_tiers.yaml`` unless ``$DDLSCALE_LOCAL_TIERS`` or an explicit path names another file.
"""
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import yaml

from ..._core import settings
from ...errors import InvalidInputError
from ..tiers import FileTierCatalog, HardwareTier

LOCAL_TIERS_ENV = settings.LOCAL_TIERS.name

_QUANTITY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGTPE]i?|k)?B?\s*")
_FACTORS = {
    None: 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def default_tiers_file() -> Path:
    """The tiers file shipped with the plugin."""
    return Path(__file__).resolve().parents[2] / "data" / "local_tiers.yaml"


def tiers_file_path(tiers_file: Union[str, Path, None] = None) -> Path:
    """The tiers file to use: ``tiers_file``, else ``$DDLSCALE_LOCAL_TIERS``, else the default."""
    if tiers_file is not None:
        return Path(tiers_file)
    from_env = settings.LOCAL_TIERS.value()
    return Path(from_env) if from_env else default_tiers_file()


def memory_bytes(quantity: str, field: str = "memory") -> int:
    """Bytes in a Kubernetes memory quantity (``1Gi``, ``512Mi``, ``2G``, ``1073741824``)."""
    match = _QUANTITY.fullmatch(str(quantity))
    if not match:
        raise InvalidInputError(field, quantity, "a memory quantity such as 512Mi, 1Gi or 2G")
    number, unit = match.groups()
    return int(float(number) * _FACTORS[unit])


@dataclass(frozen=True)
class WorkerShape:
    """The ``dask worker`` settings of one tier."""

    tier: str
    nthreads: int
    memory_limit: int
    """Bytes."""

    @classmethod
    def from_tier(cls, tier: HardwareTier) -> "WorkerShape":
        """Threads from ``cores`` (rounded down, at least 1); memory limit from ``memory``."""
        return cls(
            tier=tier.name,
            nthreads=max(1, int(tier.cores)),
            memory_limit=memory_bytes(tier.memory_limit or tier.memory, field=f"tiers[{tier.name}].memory"),
        )


def load_catalog(tiers_file: Union[str, Path, None] = None) -> FileTierCatalog:
    """The catalog of local tiers, with every tier's memory checked.

    Raises :class:`InvalidInputError` naming ``tiers_file`` when the file is
    missing, empty or unreadable.
    """
    path = tiers_file_path(tiers_file)
    try:
        catalog = FileTierCatalog(path)
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise InvalidInputError(
            "tiers_file", str(path), f"a readable YAML tiers file ({type(exc).__name__}: {exc})"
        ) from None
    if not catalog.tiers():
        raise InvalidInputError("tiers_file", str(path), "a file listing at least one tier")
    for tier in catalog.tiers():
        WorkerShape.from_tier(tier)
    return catalog


def default_tier_name(catalog: FileTierCatalog) -> str:
    """The tier a new cluster's workers get when none is asked for: the file's first tier."""
    return catalog.tiers()[0].name

