"""Backends and how one is chosen (a backend module is imported only when chosen: flytekit imports
this plugin at start-up).

:func:`get_backend` takes the ``name`` given, else ``$DDLSCALE_BACKEND``, else
``scaler`` when ``$CLUSTER_SCALER_BASE_URL`` is set or inside a Domino run
(``$DOMINO_RUN_ID``), else ``local``. Third-party backends register under the
``flytekitplugins_ddlscale.backends`` entry-point group as ``name = "module:Class"``.
"""
import importlib
from typing import Any, Dict, Mapping, Optional

from .._core import settings
from .._core.validation import ALIASES, BUILTIN_BACKENDS
from ..errors import InvalidInputError
from ._base import DEFAULT_RESTART_TIMEOUT, DEFAULT_SCALE_TIMEOUT, BackendCapabilities, BaseBackend, ClusterBackend

BACKEND_ENV = settings.BACKEND.name
"""The variable that names the backend when none is given (public; defined in :mod:`.._core.settings`)."""
ENTRY_POINT_GROUP = "flytekitplugins_ddlscale.backends"


def available_backends() -> Dict[str, str]:
    """Backend names mapped to ``module:Class``, built-ins and entry points together."""
    from importlib.metadata import entry_points

    found = dict(BUILTIN_BACKENDS)
    eps: Any = entry_points()
    group = eps.select(group=ENTRY_POINT_GROUP) if hasattr(eps, "select") else eps.get(ENTRY_POINT_GROUP, [])
    for ep in group:
        found.setdefault(ep.name, ep.value)
    return found


def backend_name_from_env(env: Optional[Mapping[str, str]] = None) -> str:
    """The backend name the environment selects (steps 2-4 of the precedence)."""
    named = settings.BACKEND.value(env=env)
    if named is not None:
        return named
    if settings.CLUSTER_SCALER_BASE_URL.is_set(env) or settings.DOMINO_RUN_ID.is_set(env):
        return "scaler"
    return "local"


def load_backend_class(name: str) -> type:
    """Import and return the class of backend ``name``."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    known = available_backends()
    if key not in known:
        raise InvalidInputError("backend", name, ", ".join(sorted(known)))
    module_name, _, attr = known[key].partition(":")
    return getattr(importlib.import_module(module_name), attr)


def get_backend(name: Optional[str] = None, **options: Any) -> ClusterBackend:
    """A backend instance: ``name`` if given, else as the environment selects; ``options`` go to its
    constructor (e.g. ``base_url=`` for the scaler, ``namespace=`` for Kubernetes, ``state_dir=`` for local)."""
    chosen = name if name else backend_name_from_env()
    return load_backend_class(chosen)(**options)


__all__ = [
    "ALIASES", "BACKEND_ENV", "BUILTIN_BACKENDS", "BackendCapabilities", "BaseBackend", "ClusterBackend",
    "DEFAULT_RESTART_TIMEOUT", "DEFAULT_SCALE_TIMEOUT", "available_backends", "backend_name_from_env", "get_backend",
    "load_backend_class",
]
