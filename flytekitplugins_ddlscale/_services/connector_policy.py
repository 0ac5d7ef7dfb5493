"""What a connector serves: the backends, namespaces, clusters and framework heads its operator allows.

A template (written by whoever registers a workflow) may choose only among what the connector's
environment allows (``$DDLSCALE_CONNECTOR_*``, docs/flyte.md) and the per-project rules of
``$DDLSCALE_CONNECTOR_POLICY`` (docs/connector.md); anything else is refused with a
:class:`NotServedError` naming the field before anything is sent.
"""
import fnmatch
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

import yaml

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


def chosen_backend(name: Optional[str]) -> str:
    """The backend a template's ``backend`` names (an alias resolved), or the connector's own for None."""
    return _backend_key(name) if name else _backend_key(backend_name_from_env())


def reported_head_hosts(backend: ClusterBackend, ref: ClusterRef) -> Tuple[str, ...]:
    """Hosts the backend says ``ref``'s head is on (its ``connection_env``); empty when it cannot say."""
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
    rules: Optional["ProjectRules"] = None
    """Per-project rules (``$DDLSCALE_CONNECTOR_POLICY``); None: every execution may use all the above."""

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
        path = settings.CONNECTOR_POLICY.value(env=env)
        return cls(
            backends=backends,
            namespaces=settings.CONNECTOR_NAMESPACES.value(env=env),
            clusters=settings.CONNECTOR_CLUSTERS.value(env=env),
            framework_hosts=settings.CONNECTOR_FRAMEWORK_HOSTS.value(env=env),
            rules=ProjectRules.load(path) if path else None,
        )

    def backend(self, name: Optional[str]) -> str:
        """The backend a template's ``backend`` (None: the connector's environment) selects, if served."""
        chosen = chosen_backend(name)
        if chosen not in self.backends:
            raise NotServedError(
                "backend", name if name else chosen, ", ".join(self.backends),
                reason=f"not served by this connector (${settings.CONNECTOR_BACKENDS.name})",
            )
        return chosen

    def check_cluster(self, ref: ClusterRef, backend: ClusterBackend) -> None:
        """Refuse ``ref`` unless its namespace and ``<kind>/<name>`` are served."""
        namespace = namespace_of(ref, backend)
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
    return _compiled(tuple(patterns)).match(value) is not None


@functools.lru_cache(maxsize=4096)
def _compiled(patterns: Tuple[str, ...]) -> "re.Pattern[str]":
    """Shell-style ``patterns`` as one regular expression (case-sensitive, as ``fnmatchcase``): a policy
    of many rules is matched in well under a millisecond (docs/benchmarks.md)."""
    return re.compile("|".join(fnmatch.translate(pattern) for pattern in patterns) or "(?!)")


def namespace_of(ref: ClusterRef, backend: Any) -> str:
    """The namespace ``ref`` is in: its own, else the backend's default, else Domino's."""
    return ref.namespace or getattr(backend, "namespace", None) or DEFAULT_NAMESPACE


MAX_EXECUTION_CHARS = 256
"""Longest execution field a policy matches (Flyte's names are at most 63 characters; identities longer)."""


def _part(value: Any, *names: str) -> Any:
    for name in names:
        try:
            value = getattr(value, name, None)
        except Exception:  # hostile metadata: a property that raises reads as absent
            return None
    return value


def text_of(value: Any) -> str:
    """``value`` if it is a string, else '' (a field of outside origin read as text)."""
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Execution:
    """Who a ``CreateTask`` acts for, as FlytePropeller sends it ('' for what it does not send)."""

    project: str = ""
    domain: str = ""
    name: str = ""
    """The workflow execution's name."""
    node: str = ""
    namespace: str = ""
    """The Kubernetes namespace the execution runs in (``<project>-<domain>`` by default)."""
    service_account: str = ""
    identity: str = ""
    """The user or app the execution runs as (its security context's ``run_as``), where Flyte knows one."""

    @classmethod
    def of(cls, metadata: Any) -> "Execution":
        """From flytekit's ``TaskExecutionMetadata`` or Flyte 2's (the same field names); never raises."""
        node = _part(metadata, "task_execution_id", "node_execution_id")
        run = _part(node, "execution_id")
        who = _part(metadata, "identity")
        identity = ""
        for path in (("execution_identity",), ("oauth2_client", "client_id"), ("iam_role",)):
            identity = identity or text_of(_part(who, *path))
        return cls(
            text_of(_part(run, "project")), text_of(_part(run, "domain")), text_of(_part(run, "name")),
            text_of(_part(node, "node_id")), text_of(_part(metadata, "namespace")),
            text_of(_part(metadata, "k8s_service_account")) or text_of(_part(who, "k8s_service_account")), identity,
        )


MATCH_KEYS = ("project", "domain", "namespace", "service_account", "identity")
ALLOW_KEYS = ("backends", "namespaces", "kinds", "clusters", "max_workers", "tiers", "owner")
RULE_KEYS = ("name", "match", "allow")


@dataclass(frozen=True)
class Rule:
    """One rule of a policy: the executions it covers (``match``) and what their nodes may use (``allow``)."""

    name: str
    match: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    """Execution field -> shell-style patterns; every field given must match one."""
    allow: Dict[str, Any] = field(default_factory=dict)
    """Allow key -> patterns (``max_workers``: an integer, ``owner``: a user id); a key left out: no limit."""

    def refuse(self, key: str, value: Any, allowed: Any) -> "NotServedError":
        """The one line naming this rule, for ``value`` of ``key`` it does not allow."""
        shown = ", ".join(allowed) if isinstance(allowed, tuple) else str(allowed)
        return NotServedError(
            key, value, shown, reason=f"rule {self.name!r} of the connector's policy (${settings.CONNECTOR_POLICY.name}) "
            "does not allow it",
        )

    def check(self, backend: str, ref: ClusterRef, namespace: str, given: Mapping[str, Any]) -> None:
        """Refuse (:class:`NotServedError` naming this rule) what the rule does not allow, sending nothing:
        ``given`` holds the change's inputs (replicas, tiers) where the node changes the cluster."""
        for key, value in (("backends", backend), ("namespaces", namespace), ("kinds", ref.kind),
                           ("clusters", f"{ref.kind}/{ref.name}")):
            if key in self.allow and not _matches(value, self.allow[key]):
                raise self.refuse(key, value, self.allow[key])
        for name in ("worker_hw_tier", "head_hw_tier"):
            if given.get(name) and "tiers" in self.allow and not _matches(given[name], self.allow["tiers"]):
                raise self.refuse(name, given[name], self.allow["tiers"])
        replicas = given.get("replicas")
        if isinstance(replicas, int) and replicas > self.allow.get("max_workers", replicas):
            raise self.refuse("replicas", replicas, f"at most {self.allow['max_workers']} (max_workers)")


@dataclass(frozen=True)
class ProjectRules:
    """A deployment's per-project rules (``$DDLSCALE_CONNECTOR_POLICY``), in order: the first that covers an
    execution applies."""

    rules: Tuple[Rule, ...]
    path: str = ""
    by_project: Dict[str, Tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)
    """Project -> the rules naming it without a wildcard; the others are tried for every execution."""
    any_project: Tuple[int, ...] = ()

    def __post_init__(self) -> None:
        named: Dict[str, List[int]] = {}
        others = []
        for index, rule in enumerate(self.rules):
            projects = rule.match.get("project", ("*",))
            if any(char in pattern for pattern in projects for char in "*?["):
                others.append(index)
                continue
            for project in projects:
                named.setdefault(project, []).append(index)
        object.__setattr__(self, "by_project", {key: tuple(value) for key, value in named.items()})
        object.__setattr__(self, "any_project", tuple(others))

    @classmethod
    def load(cls, path: str) -> "ProjectRules":
        """The rules in the YAML file ``path``; :class:`InvalidInputError` naming the file, or the key and
        what is allowed there, for one that cannot be read, does not parse or is not a policy."""
        setting = settings.CONNECTOR_POLICY
        try:
            with open(path, encoding="utf-8") as handle:
                data = yaml.safe_load(handle.read(1 << 20))
        except (OSError, UnicodeError, yaml.YAMLError) as error:
            why = " ".join(str(error).split())[:300]
            raise InvalidInputError(setting.name, path, "a readable YAML policy file", reason=why) from None
        top = _mapping("policy", data, ("rules",))
        rules = _list("policy.rules", top.get("rules", []))
        parsed = tuple(_rule(f"policy.rules[{index}]", rule) for index, rule in enumerate(rules))
        names = [rule.name for rule in parsed]
        doubled = sorted({name for name in names if names.count(name) > 1})
        if doubled:
            raise InvalidInputError("policy.rules.name", doubled[0], "a name used by one rule only")
        return cls(parsed, path)

    def rule_for(self, execution: Execution) -> Rule:
        """The first rule covering ``execution``; :class:`NotServedError` when none does, or when one of its
        fields is longer than :data:`MAX_EXECUTION_CHARS` (hostile metadata)."""
        for key in MATCH_KEYS:
            value = getattr(execution, key)
            if len(value) > MAX_EXECUTION_CHARS:
                raise InvalidInputError(f"execution.{key}", value, f"at most {MAX_EXECUTION_CHARS} characters")
        for index in sorted(self.by_project.get(execution.project, ()) + self.any_project):
            rule = self.rules[index]
            if all(_matches(getattr(execution, key), patterns) for key, patterns in rule.match.items()):
                return rule
        raise NotServedError(
            "project", f"{execution.project}/{execution.domain}", ", ".join(r.name for r in self.rules) or "no rule",
            reason=f"no rule of the connector's policy (${settings.CONNECTOR_POLICY.name}) covers this execution",
        )


def _mapping(where: str, value: Any, keys: Tuple[str, ...]) -> Dict[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise InvalidInputError(where, type(value).__name__, f"a mapping with keys {', '.join(keys)}")
    for key in value:
        if key not in keys:
            raise InvalidInputError(f"{where}.{key}", value[key], ", ".join(keys), reason="unknown key")
    return value


def _list(where: str, value: Any) -> List[Any]:
    if not isinstance(value, list):
        raise InvalidInputError(where, type(value).__name__, "a list")
    return value


def _patterns(where: str, value: Any) -> Tuple[str, ...]:
    items = [value] if isinstance(value, str) else _list(where, value)
    if not items or not all(isinstance(item, str) and item for item in items):
        raise InvalidInputError(where, value, "a non-empty string or list of non-empty strings (shell-style patterns)")
    return tuple(items)


def _rule(where: str, value: Any) -> Rule:
    raw = _mapping(where, value, RULE_KEYS)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidInputError(f"{where}.name", name, "a non-empty string naming the rule in refusals and audit lines")
    match = {k: _patterns(f"{where}.match.{k}", v) for k, v in _mapping(f"{where}.match", raw.get("match"), MATCH_KEYS).items()}
    allow: Dict[str, Any] = {}
    for key, item in _mapping(f"{where}.allow", raw.get("allow"), ALLOW_KEYS).items():
        if key == "max_workers" and (isinstance(item, bool) or not isinstance(item, int) or item < 0):
            raise InvalidInputError(f"{where}.allow.max_workers", item, "an integer >= 0")
        if key == "owner" and (not isinstance(item, str) or not item):
            raise InvalidInputError(f"{where}.allow.owner", item, "a user id (the clusters' starting-user-id label)")
        allow[key] = item if key in ("max_workers", "owner") else _patterns(f"{where}.allow.{key}", item)
    if "backends" in allow:
        allow["backends"] = tuple(_backend_key(name) for name in allow["backends"])
    return Rule(name, match, allow)


def served_at_start(env: Optional[Mapping[str, str]] = None) -> Tuple[ConnectorPolicy, Tuple[str, ...]]:
    """The policy a starting connector will serve, with its settings parsed and each served backend's class
    imported (else :class:`InvalidInputError` naming the variable or backend), and notes on what it will
    refuse though it starts."""
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
    notes: List[str] = [
        f"per-project policy {policy.rules.path}: {len(policy.rules.rules)} rules" if policy.rules else
        f"no per-project policy (${settings.CONNECTOR_POLICY.name} unset): every project may use all this connector serves"
    ]
    own = _backend_key(backend_name_from_env(env))
    if own not in policy.backends:
        notes.append(
            f"nodes that name no backend use this connector's own, {own!r} (${settings.BACKEND.name}), which "
            f"${settings.CONNECTOR_BACKENDS.name} does not serve ({', '.join(policy.backends)}): they are refused"
        )
    return policy, tuple(notes)


def start_lines() -> Tuple[bool, Tuple[str, ...]]:
    """What a starting connector server prints: (True, its notes) when it may serve, else (False, the one line
    saying why not). Never raises."""
    try:
        _, notes = served_at_start()
    except Exception as error:  # noqa: BLE001 - the one line is all a failed start says
        return False, (f"ddlscale connector: not starting: {error}",)
    return True, tuple(f"ddlscale connector: {note}" for note in notes)
