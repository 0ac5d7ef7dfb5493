"""The readiness every surface reports after the backend's own wait: how many workers are ready and what
proved it (the backend, plus the framework check; docs/readiness.md).
"""
from dataclasses import dataclass
from typing import Mapping, Optional

from ..backends._base import ClusterBackend
from ..models import ClusterState, ScaleResult
from .._core.progress import ProgressReporter, plural
from ..refs import ClusterRef
from .._core.validation import validate_bool, validate_url
from .._framework.endpoints import enabled_by_env, resolve_endpoint, where_to_set
from .._framework.probes import probe_for
from .._framework.wait import Registered, wait_registered

@dataclass(frozen=True)
class FrameworkOptions:
    """Whether to check framework readiness, and where the head is if not found automatically."""

    enabled: bool = True
    url: Optional[str] = None
    """The head's dashboard / web UI base URL; None: resolved from the environment."""
    env: Optional[Mapping[str, str]] = None
    """The environment to resolve from; None: ``os.environ``."""

    def __post_init__(self) -> None:
        validate_bool(self.enabled, "framework_ready")
        object.__setattr__(self, "url", validate_url(self.url))

    def check(self, kind: str) -> None:
        """:class:`InvalidInputError` now for a bad switch, URL or port variable: refused before any change."""
        if self.enabled and enabled_by_env(self.env):
            resolve_endpoint(kind, self.url, self.env)


@dataclass(frozen=True)
class Readiness:
    """How ready the workers are, and what proved it."""

    ready_workers: Optional[int]
    """Ready workers: the framework's count where it was checked and the backend cannot see
    pod readiness, else the backend's Ready count; None when nothing could show it."""
    proof: str
    framework: Optional[Registered] = None
    seconds: float = 0.0
    """Seconds spent in the framework check."""


def backend_proof(backend: ClusterBackend, state: ClusterState, kind: str) -> str:
    """What the backend's own wait proved about ``state`` of a ``kind`` cluster, in words."""
    if backend.capabilities.counts_registered_workers:
        probe = probe_for(kind)
        registry = probe.registry if probe is not None else f"the {kind} cluster"
        return f"{plural(state.ready_workers or 0, 'worker')} registered with {registry} ({backend.name} backend)"
    if backend.capabilities.observes_readiness and state.ready_workers is not None:
        return f"{state.ready_workers} worker pods Ready ({backend.name})"
    return f"{state.existing_workers} worker pods exist ({backend.name}; pod readiness not visible)"


def removed_workers(result: ScaleResult) -> bool:
    """Whether the change behind ``result`` took workers away (fewer than were wanted or running before)."""
    before = result.previous
    return result.effective < max(before.desired_workers, before.existing_workers)


@dataclass(frozen=True)
class ReadinessCheck:
    """What proves a cluster's workers ready after the backend's own wait: the backend and cluster, whether and
    where to ask the framework, and where the wait's progress goes; asked with what is left of the deadline."""

    backend: ClusterBackend
    ref: ClusterRef
    options: FrameworkOptions = FrameworkOptions()
    progress: Optional[ProgressReporter] = None

    def ready(self, state: ClusterState, workers: int, timeout: float, *, removed: bool = False) -> Readiness:
        """After the backend's wait ended in ``state``: wait (up to ``timeout``) until ``workers`` workers are
        registered with the framework (``removed``: at most ``workers``, after a scale-down) where that applies,
        and say what proved readiness, or why the framework was not asked. Raises ``ScalingTimeoutError``."""
        backend, ref, options = self.backend, self.ref, self.options
        base = backend_proof(backend, state, ref.kind)
        known = state.ready_workers
        if not options.enabled or not enabled_by_env(options.env):
            return Readiness(known, f"{base}; framework check off")
        if (workers <= 0 and not removed) or backend.capabilities.counts_registered_workers:
            return Readiness(known, base)
        if probe_for(ref.kind) is None:
            return Readiness(known, f"{base}; {ref.kind} has no head to ask")
        endpoint = resolve_endpoint(ref.kind, options.url, options.env)
        if endpoint is None:
            return Readiness(known, f"{base}; framework not checked (head address unknown: set {where_to_set(ref.kind)})")
        registered = wait_registered(
            endpoint, workers, timeout, removed=removed, cluster=str(ref), state=state, progress=self.progress
        )
        ready = registered.workers if known is None else min(known, registered.workers)
        return Readiness(ready, f"{base}; {registered.proof}", registered, registered.seconds)

    def change(self, result: ScaleResult, timeout: float, needed: Optional[int] = None) -> Readiness:
        """:meth:`ready` for the waited-for ``result`` of a scale, restore or reconcile: its workers registered
        (at least ``needed`` of them, when given), or, when it removed workers, the framework rid of them."""
        count = result.effective if needed is None else min(needed, result.effective)
        return self.ready(result.final, count, timeout, removed=removed_workers(result))
