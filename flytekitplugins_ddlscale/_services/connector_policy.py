"""What a connector serves: the backends, namespaces, clusters and framework heads its operator allows.

A task template is written by whoever registers a workflow; the connector
runs with the deployment's credentials. So the template may choose only
among what the connector's own environment allows, read once when the
connector starts:

* ``$DDLSCALE_CONNECTOR_BACKENDS``: backends served, comma-separated
  (default ``scaler,kubernetes``). ``local`` (real clusters as children of
  the connector process) is served only when listed.
* ``$DDLSCALE_CONNECTOR_NAMESPACES``: namespaces served (default: any).
  A cluster without a namespace is in the backend's default namespace
  (the Kubernetes backend's, else ``domino-compute``).
* ``$DDLSCALE_CONNECTOR_CLUSTERS``: ``<kind>/<name>`` patterns served,
  shell-style (``dask/team-a-*``; default: any).
* ``$DDLSCALE_CONNECTOR_FRAMEWORK_HOSTS``: hosts a template's
  ``framework_url`` may name, shell-style patterns
  (``*.domino-compute.svc.cluster.local``), besides the head host the
  backend itself reports for the cluster (default: only that one).

A template asking for anything else is refused with a :class:`NotServedError`
naming the field, the value and what is served, before anything is sent.
"""
import fnmatch
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from ..backends import ALIASES, available_backends, backend_name_from_env, load_backend_class
from ..backends._base import ClusterBackend
from .._core import settings
from ..errors import InvalidInputError, ScalingError
from ..refs import DEFAULT_NAMESPACE, ClusterRef

DEFAULT_BACKENDS = settings.CONNECTOR_BACKENDS.default
"""Served when ``$DDLSCALE_CONNECTOR_BACKENDS`` is unset: the backends that change clusters elsewhere."""


class NotServedError(InvalidInputError):
    """A template asked for a backend, namespace, cluster or head this connector does not serve."""

    code = "not_served"


def _backend_key(name: str) -> str:
    key = name.strip().lower()
    return ALIASES.get(key, key)


def reported_head_hosts(backend: ClusterBackend, ref: ClusterRef) -> Tuple[str, ...]:
    """Hosts the backend says ``ref``'s head is on (its ``connection_env``); empty when it cannot say.

    Domino injects the head's address into a run itself, so the scaler backend
    reports none; the Kubernetes backend reports the operators' head services.
    """
    try:
        env = backend.connection_env(ref)
    except ScalingError:
        return ()
    hosts = []
    for key, value in env.items():
        if key.endswith("_HOST"):
            hosts.append(value)
        elif "://" in value:
            hosts.append(urlsplit(value).hostname or "")
    return tuple(h.strip().lower() for h in hosts if h.strip())


@dataclass(frozen=True)
class ConnectorPolicy:
    """The backends, namespaces, clusters and extra head hosts a connector serves."""

    backends: Tuple[str, ...] = DEFAULT_BACKENDS
    namespaces: Optional[Tuple[str, ...]] = None
    """None: any namespace."""
    clusters: Optional[Tuple[str, ...]] = None
    """``<kind>/<name>`` patterns; None: any cluster."""
    framework_hosts: Tuple[str, ...] = ()
    """Host patterns a ``framework_url`` may name besides the head host the backend reports."""

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "ConnectorPolicy":
        """The policy the environment sets; :class:`InvalidInputError` naming the variable for an
        unknown backend name."""
        known = available_backends()
        backends = tuple(dict.fromkeys(_backend_key(name) for name in settings.CONNECTOR_BACKENDS.value(env=env)))
        unknown = [name for name in backends if name not in known]
        if unknown:
            setting = settings.CONNECTOR_BACKENDS
            raise InvalidInputError(setting.name, setting.raw(env), ", ".join(sorted(known)))
        return cls(
            backends=backends,
            namespaces=settings.CONNECTOR_NAMESPACES.value(env=env),
            clusters=settings.CONNECTOR_CLUSTERS.value(env=env),
            framework_hosts=settings.CONNECTOR_FRAMEWORK_HOSTS.value(env=env),
        )

    def backend(self, name: Optional[str]) -> str:
        """The backend a template's ``backend`` (None: the connector's environment) selects, if served."""
        chosen = _backend_key(name) if name else _backend_key(backend_name_from_env())
        if chosen not in self.backends:
            raise NotServedError(
                "backend", name if name else chosen, ", ".join(self.backends),
                reason=f"not served by this connector (${settings.CONNECTOR_BACKENDS.name})",
            )
        return chosen

    def check_cluster(self, ref: ClusterRef, backend: ClusterBackend) -> None:
        """Refuse ``ref`` unless its namespace and ``<kind>/<name>`` are served."""
        namespace = ref.namespace or getattr(backend, "namespace", None) or DEFAULT_NAMESPACE
        if self.namespaces is not None and namespace not in self.namespaces:
            raise NotServedError(
                "namespace", namespace, ", ".join(self.namespaces),
                reason=f"not served by this connector (${settings.CONNECTOR_NAMESPACES.name})",
            )
        name = f"{ref.kind}/{ref.name}"
        if self.clusters is not None and not _matches(name, self.clusters):
            raise NotServedError(
                "cluster", str(ref), ", ".join(self.clusters),
                reason=f"not served by this connector (${settings.CONNECTOR_CLUSTERS.name}, matched against {name!r})",
            )

    def check_framework_url(self, url: str, reported: Iterable[str]) -> None:
        """Refuse a template's ``framework_url`` whose host is neither ``reported`` by the backend
        for that cluster nor allowed by ``$DDLSCALE_CONNECTOR_FRAMEWORK_HOSTS``."""
        host = (urlsplit(url).hostname or "").lower()
        heads = tuple(reported)
        if host in heads or _matches(host, self.framework_hosts):
            return
        allowed = ", ".join(heads + self.framework_hosts) or "none (the backend reports no head host)"
        raise NotServedError(
            "framework_url", url, f"a URL on {allowed}",
            reason=f"host {host!r} is not a head this connector may read (${settings.CONNECTOR_FRAMEWORK_HOSTS.name})",
        )


def _matches(value: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


def served_at_start(env: Optional[Mapping[str, str]] = None) -> Tuple[ConnectorPolicy, Tuple[str, ...]]:
    """What a starting connector will serve, checked before it serves anything: the policy
    (:meth:`ConnectorPolicy.from_env`), the call budget and the dashboard links parsed, and each served
    backend's class imported, so a connector none of whose calls could be served never reports healthy. Raises
    :class:`InvalidInputError` naming the first variable that does not parse or the backend that does
    not load. Also returns notes on what it will refuse though it starts: the nodes that name no
    backend, where the connector's own (``$DDLSCALE_BACKEND``) is not served."""
    policy = ConnectorPolicy.from_env(env)
    settings.CONNECTOR_CALL_BUDGET.value(env=env)
    settings.CONNECTOR_DASHBOARD_URL.value(env=env)
    for name in policy.backends:
        try:
            load_backend_class(name)
        except Exception as error:  # an entry-point backend whose module or dependencies do not import
            setting = settings.CONNECTOR_BACKENDS
            raise InvalidInputError(
                setting.name, setting.raw(env) or ",".join(policy.backends),
                f"{', '.join(sorted(available_backends()))}, each importable here",
                reason=f"backend {name!r} does not load ({type(error).__name__}: {error})",
            ) from None
    notes: List[str] = []
    own = _backend_key(backend_name_from_env(env))
    if own not in policy.backends:
        notes.append(
            f"nodes that name no backend use this connector's own, {own!r} (${settings.BACKEND.name}), which "
            f"${settings.CONNECTOR_BACKENDS.name} does not serve ({', '.join(policy.backends)}): they are refused"
        )
    return policy, tuple(notes)
