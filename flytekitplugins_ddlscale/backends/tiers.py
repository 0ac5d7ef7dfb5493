"""Hardware tiers: what a tier name means in cores, memory, GPUs and node pool.

A :class:`TierCatalog` resolves a tier NAME for a cluster kind, refusing
unknown names and tiers restricted to other kinds before anything changes.
Catalogs: :class:`DominoTierCatalog` (``GET <nucleus>/v4/hardwareTier``,
through ``$DOMINO_API_PROXY``) and :class:`FileTierCatalog` (a YAML or JSON
file in either this plugin's short form or Domino's own response shape).
"""
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Union

import yaml

from ..errors import BackendUnavailableError, CertificateRefusedError, UnknownTierError
from .._core.outage import cert_verification_failed
from ..refs import normalize_kind
from .._core.validation import closest_choice, validate_tier_name

_DOMINO_UNITS = {"GiB": "Gi", "MiB": "Mi", "KiB": "Ki", "TiB": "Ti", "GB": "G", "MB": "M", "KB": "k"}
_RESTRICT_KEYS = {"restrictToSpark": "spark", "restrictToRay": "ray", "restrictToDask": "dask", "restrictToMpi": "mpi"}


@dataclass(frozen=True)
class HardwareTier:
    """One hardware tier, in Kubernetes terms."""

    name: str
    id: str
    cores: float
    memory: str
    """Memory request as a Kubernetes quantity, e.g. ``4Gi``."""
    cores_limit: Optional[float] = None
    memory_limit: Optional[str] = None
    gpus: int = 0
    node_pool: Optional[str] = None
    restricted_to: FrozenSet[str] = field(default_factory=frozenset)
    """Kinds this tier is limited to; empty means every kind."""

    def allows(self, kind: str) -> bool:
        """Whether clusters of ``kind`` may use this tier."""
        return not self.restricted_to or normalize_kind(kind) in self.restricted_to

    def resources(self) -> Dict[str, Dict[str, str]]:
        """The ``resources`` block (requests and limits) for a pod section."""
        requests = {"cpu": _quantity(self.cores), "memory": self.memory}
        limits = {
            "cpu": _quantity(self.cores_limit if self.cores_limit is not None else self.cores),
            "memory": self.memory_limit or self.memory,
        }
        if self.gpus:
            requests["nvidia.com/gpu"] = str(self.gpus)
            limits["nvidia.com/gpu"] = str(self.gpus)
        return {"requests": requests, "limits": limits}


def _quantity(cores: float) -> str:
    return str(int(cores)) if float(cores).is_integer() else f"{int(round(cores * 1000))}m"


def _domino_memory(value: Optional[Mapping[str, Any]]) -> Optional[str]:
    if not value:
        return None
    amount = value.get("value")
    unit = value.get("unit", "GiB")
    number = int(amount) if float(amount).is_integer() else amount
    return f"{number}{_DOMINO_UNITS.get(unit, unit)}"


def tier_from_domino(raw: Mapping[str, Any]) -> HardwareTier:
    """A tier from one entry of Domino's ``/v4/hardwareTier`` response."""
    res = raw.get("hwtResources") or {}
    restrictions = raw.get("computeClusterRestrictions") or {}
    gpu = raw.get("gpuConfiguration") or {}
    return HardwareTier(
        name=raw["name"],
        id=raw.get("id") or raw["name"],
        cores=float(res.get("cores", 1)),
        cores_limit=float(res["coresLimit"]) if res.get("coresLimit") is not None else None,
        memory=_domino_memory(res.get("memory")) or "1Gi",
        memory_limit=_domino_memory(res.get("memoryLimit")),
        gpus=int(gpu.get("numberOfGpus") or 0),
        node_pool=raw.get("nodePool"),
        restricted_to=frozenset(k for key, k in _RESTRICT_KEYS.items() if restrictions.get(key)),
    )


def tier_from_short(raw: Mapping[str, Any]) -> HardwareTier:
    """A tier from this plugin's short YAML form (``name, cores, memory, gpus, nodePool, restrictTo``)."""
    restrict = raw.get("restrictTo") or []
    return HardwareTier(
        name=str(raw["name"]),
        id=str(raw.get("id") or raw["name"]),
        cores=float(raw.get("cores", 1)),
        cores_limit=float(raw["coresLimit"]) if raw.get("coresLimit") is not None else None,
        memory=str(raw.get("memory", "1Gi")),
        memory_limit=str(raw["memoryLimit"]) if raw.get("memoryLimit") else None,
        gpus=int(raw.get("gpus", 0)),
        node_pool=raw.get("nodePool"),
        restricted_to=frozenset(normalize_kind(k, field="restrictTo") for k in restrict),
    )


def parse_tiers(document: Union[Mapping[str, Any], List[Any]]) -> List[HardwareTier]:
    """Tiers from a loaded document: ``{"tiers": [...]}``, ``{"hardwareTiers": [...]}`` or a list."""
    if isinstance(document, Mapping) and "hardwareTiers" in document:
        return [tier_from_domino(t) for t in document["hardwareTiers"]]
    entries = document.get("tiers", []) if isinstance(document, Mapping) else document
    return [tier_from_domino(t) if "hwtResources" in t else tier_from_short(t) for t in entries]


class TierCatalog:
    """Resolves tier names; subclasses say where the list of tiers comes from."""

    def tiers(self) -> List[HardwareTier]:
        """Every known tier."""
        raise NotImplementedError

    def resolve(self, name: Optional[str], kind: str, field: str = "worker_hw_tier") -> Optional[HardwareTier]:
        """The tier called ``name`` (exactly, else without case when only one matches so) for clusters
        of ``kind``; None when ``name`` is None. :class:`UnknownTierError` naming ``field``, the allowed
        names and the closest one for an unknown or restricted tier."""
        wanted = validate_tier_name(name, field=field)
        if wanted is None:
            return None
        short = normalize_kind(kind)
        known = self.tiers()
        allowed = sorted(t.name for t in known if t.allows(short))
        names = ", ".join(allowed) or "none"
        tier = _matching(known, wanted)
        if tier is not None and tier.allows(short):
            return tier
        if tier is not None:
            why = f"{field}={wanted!r} is restricted to {', '.join(sorted(tier.restricted_to))} clusters"
        else:
            why = f"unknown {field}={wanted!r}"
        best = closest_choice(wanted, allowed) if tier is None else None
        hint = f"; closest: {best!r}" if best is not None else ""
        raise UnknownTierError(f"{why}; allowed for {short}: {names}{hint}", field=field, value=wanted, allowed=names)


def _matching(known: List[HardwareTier], wanted: str) -> Optional[HardwareTier]:
    """The tier named ``wanted`` exactly, else the only one named so without case (None: no such tier,
    or several that differ only in case)."""
    exact = [tier for tier in known if tier.name == wanted]
    if exact:
        return exact[0]
    folded = [tier for tier in known if tier.name.lower() == wanted.lower()]
    return folded[0] if len(folded) == 1 else None


class StaticTierCatalog(TierCatalog):
    """A fixed list of tiers."""

    def __init__(self, tiers: Iterable[HardwareTier]) -> None:
        self._tiers = list(tiers)

    def tiers(self) -> List[HardwareTier]:
        return list(self._tiers)


class FileTierCatalog(StaticTierCatalog):
    """Tiers from a YAML or JSON file (short form or Domino's response shape)."""

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        with self.path.open(encoding="utf-8") as handle:
            super().__init__(parse_tiers(yaml.safe_load(handle) or {}))


class DominoTierCatalog(TierCatalog):
    """Tiers read from Domino's ``/v4/hardwareTier``, once, then cached."""

    def __init__(self, base_url: str, auth: Any = None, timeout: float = 10.0, verify: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self._auth = auth
        self._timeout = timeout
        self._verify = verify
        self._cache: Optional[List[HardwareTier]] = None
        self._lock = threading.Lock()

    def tiers(self) -> List[HardwareTier]:
        with self._lock:
            if self._cache is None:
                self._cache = self._load()
            return list(self._cache)

    def _load(self) -> List[HardwareTier]:
        import httpx

        try:
            response = httpx.get(
                f"{self.base_url}/v4/hardwareTier", auth=self._auth, timeout=self._timeout, verify=self._verify
            )
        except httpx.HTTPError as exc:
            if cert_verification_failed(exc):
                raise CertificateRefusedError(
                    "could not list hardware tiers from Domino: its TLS certificate was refused"
                ) from None
            raise BackendUnavailableError(f"could not list hardware tiers from Domino ({type(exc).__name__})") from None
        if response.status_code != 200:
            raise BackendUnavailableError(
                f"listing hardware tiers answered HTTP {response.status_code}", status_code=response.status_code
            )
        return parse_tiers(response.json())

