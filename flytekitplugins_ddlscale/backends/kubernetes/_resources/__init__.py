"""One adapter per flavour of cluster resource the Kubernetes backend scales.

The backend speaks to every cluster through :class:`ResourceAdapter`: which
object to patch, what its workers are, the patch that sets N workers and
holds them against that operator's autoscaler, the patch that restores the
recorded baseline, and which pods are workers and head. ``dco`` serves
Domino's distributed-compute operator, ``kuberay`` KubeRay's RayCluster,
``daskop`` the Dask operator's DaskWorkerGroup.
"""
from typing import Dict

from ..._support.crds import CrdLayout
from .base import Outcome, Patch, ResourceAdapter
from .daskop import DaskOperatorAdapter
from .dco import DcoAdapter
from .kuberay import KubeRayAdapter

_FLAVOURS = {"dco": DcoAdapter, "kuberay": KubeRayAdapter, "daskop": DaskOperatorAdapter}
_ADAPTERS: Dict[str, ResourceAdapter] = {}


def adapter_for(layout: CrdLayout) -> ResourceAdapter:
    """The adapter of ``layout``'s kind (one shared instance per kind; adapters keep no state)."""
    if layout.kind not in _ADAPTERS:
        _ADAPTERS[layout.kind] = _FLAVOURS[layout.flavour](layout)
    return _ADAPTERS[layout.kind]


__all__ = ["Outcome", "Patch", "ResourceAdapter", "adapter_for"]
