"""Which cluster: what a user may write (kinds, names, worker groups, cluster strings) and what each kind
is, whichever backend serves it (:data:`KINDS`). Kubernetes layouts: ``backends/_support/crds.py``."""
import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

from ._core import settings
from ._core.validation import closest_reason
from .errors import InvalidInputError

DEFAULT_NAMESPACE = "domino-compute"


@dataclass(frozen=True)
class KindInfo:
    """What a kind of distributed-compute cluster is, whichever backend serves it."""

    kind: str
    """Short name: ``ray``, ``spark``, ``dask``, ``mpi``, ``kuberay`` or ``dask-operator``."""
    plural: str
    """Plural resource name, as in REST paths and the scaler service: ``rayclusters``."""
    framework: str
    """The framework its head runs (``ray``, ``spark``, ``dask``, ``mpi``): how workers registered
    with it are counted, whichever operator manages the cluster."""
    domino: bool
    """Whether it is one of Domino's kinds (managed by Domino's distributed-compute operator)."""
    autoscaling: bool
    """Whether its clusters take an autoscaling section."""
    served_by_scaler: bool
    """Whether Domino's scaler service accepts this kind."""
    worker_groups: bool = False
    """Whether clusters of this kind have named worker groups (chosen with ``ClusterRef.group``)."""


KINDS: Dict[str, KindInfo] = {
    "ray": KindInfo("ray", "rayclusters", "ray", domino=True, autoscaling=True, served_by_scaler=True),
    "spark": KindInfo("spark", "sparkclusters", "spark", domino=True, autoscaling=True, served_by_scaler=True),
    "dask": KindInfo("dask", "daskclusters", "dask", domino=True, autoscaling=True, served_by_scaler=True),
    "mpi": KindInfo("mpi", "mpiclusters", "mpi", domino=True, autoscaling=False, served_by_scaler=False),
    # Clusters of the open-source operators, served by the Kubernetes backend only.
    "kuberay": KindInfo(
        "kuberay", "rayclusters", "ray", domino=False, autoscaling=True, served_by_scaler=False, worker_groups=True
    ),
    "dask-operator": KindInfo(
        "dask-operator", "daskclusters", "dask", domino=False, autoscaling=True, served_by_scaler=False,
        worker_groups=True,
    ),
}
# Plurals name Domino's kinds only: "rayclusters" stays Domino's RayCluster, as it always was.
_BY_PLURAL = {info.plural: info for info in KINDS.values() if info.domino}
ALLOWED_KINDS = tuple(KINDS) + tuple(_BY_PLURAL)
"""Every kind name accepted, short and plural (in any case)."""
KIND_NAMES = tuple(KINDS)
"""The kinds as help and errors list them: each once, by its short name (plurals are accepted too)."""
GROUPED_KINDS = tuple(kind for kind, info in KINDS.items() if info.worker_groups)
"""The kinds whose clusters have named worker groups."""

# Cluster names become label values and prefixes of pod names, so they must be
# DNS-1123 labels (63 characters at most). Patterns are used with fullmatch: "$"
# would also match before a trailing newline.
_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_NAME_LENGTH = 63
MAX_CLUSTER_TEXT = 3 * MAX_NAME_LENGTH + 2 + 1 + MAX_NAME_LENGTH
"""Longest cluster string: namespace/kind/name@group, each part a 63-character name (a kind is shorter)."""
# Worker group names become label values (ray.io/group, dask.org/workergroup-name).
_GROUP_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
GROUP_SEPARATOR = "@"


def normalize_kind(kind: str, field: str = "kind") -> str:
    """The short kind (``ray``...) of a short or plural kind name, in any case; else an
    :class:`InvalidInputError` naming ``field``, the allowed kinds and the closest one."""
    if isinstance(kind, str):
        key = kind.strip().lower()
        if key in KINDS:
            return key
        if key in _BY_PLURAL:
            return _BY_PLURAL[key].kind
    raise InvalidInputError(field, kind, ", ".join(KIND_NAMES), reason=closest_reason(kind, ALLOWED_KINDS))


def validate_name(name: str, field: str = "name") -> str:
    """Return ``name`` if it is a valid cluster name, else raise :class:`InvalidInputError`."""
    if not isinstance(name, str) or not name:
        raise InvalidInputError(field, name, "a non-empty DNS-1123 label (lowercase a-z, 0-9, '-')")
    if len(name) > MAX_NAME_LENGTH or not _NAME_RE.fullmatch(name):
        raise InvalidInputError(field, name, f"a DNS-1123 label: lowercase a-z, 0-9 and '-', starting and ending "
                                f"with a letter or digit, at most {MAX_NAME_LENGTH} characters")
    return name


def validate_group(group: Optional[str], kind: str, field: str = "group") -> Optional[str]:
    """``group`` (a worker group name, or None for the default) if ``kind`` has worker groups; an
    :class:`InvalidInputError` naming ``field`` for a malformed name or any group on a Domino kind."""
    if group is None:
        return None
    if not KINDS[kind].worker_groups:
        raise InvalidInputError(
            field, group,
            f"None: {kind} clusters have one worker section; worker groups exist on {', '.join(GROUPED_KINDS)}",
        )
    if not isinstance(group, str) or len(group) > MAX_NAME_LENGTH or not _GROUP_RE.fullmatch(group):
        allowed = "a worker group name: letters, digits, '-', '_' and '.', at most 63 characters"
        raise InvalidInputError(field, group, allowed)
    return group


@dataclass(frozen=True)
class ClusterRef:
    """One distributed-compute cluster: ``kind`` one of :data:`KIND_NAMES` (or a Domino kind's plural),
    kept short; ``namespace`` None is the backend's default; ``group`` a worker group of a ``kuberay``
    or ``dask-operator`` cluster (None: the only one, or ``default``), written ``kind/name@group``."""

    kind: str
    name: str
    namespace: Optional[str] = None
    group: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", normalize_kind(self.kind))
        validate_name(self.name)
        if self.namespace is not None:
            validate_name(self.namespace, field="namespace")
        validate_group(self.group, self.kind)

    @property
    def info(self) -> KindInfo:
        """What this cluster's kind is (:class:`KindInfo`)."""
        return KINDS[self.kind]

    @property
    def plural(self) -> str:
        """The plural resource name of this cluster's kind, e.g. ``rayclusters``."""
        return self.info.plural

    @classmethod
    def for_run(cls, kind: str, run_id: Optional[str] = None, namespace: Optional[str] = None) -> "ClusterRef":
        """The cluster Domino attached to a run, ``<kind>-<run id>`` (default: ``$DOMINO_RUN_ID``; without
        either, an :class:`InvalidInputError` naming ``run_id``)."""
        short = normalize_kind(kind)
        if not KINDS[short].domino:
            raise InvalidInputError(
                "kind", kind, ", ".join(k for k, info in KINDS.items() if info.domino),
                reason="a Domino run's own cluster is one of Domino's kinds; name other clusters",
            )
        run = run_id if run_id is not None else settings.DOMINO_RUN_ID.value()
        if not run:
            raise InvalidInputError("run_id", run_id, "a Domino run id (argument or $DOMINO_RUN_ID)")
        return cls(short, f"{short}-{run.strip().lower()}", namespace)

    @classmethod
    def parse(cls, text: str, namespace: Optional[str] = None) -> "ClusterRef":
        """The cluster ``<kind>/<name>`` or ``<namespace>/<kind>/<name>`` names; else an
        :class:`InvalidInputError` saying what is wrong and showing the accepted forms."""
        in_text, kind, name, group = _cluster_parts(text, "cluster", bare_kind=False)
        assert name is not None
        return cls(kind, name, in_text if in_text is not None else namespace, group)

    def __str__(self) -> str:
        prefix = f"{self.namespace}/" if self.namespace else ""
        suffix = f"{GROUP_SEPARATOR}{self.group}" if self.group is not None else ""
        return f"{prefix}{self.kind}/{self.name}{suffix}"


CLUSTER_FORMS = (
    f"'<kind>/<name>', '<namespace>/<kind>/<name>' (either with '@<worker group>' on {' and '.join(GROUPED_KINDS)} "
    "clusters), or a bare kind for the Domino run's own cluster"
)
"""The cluster strings that nodes, phases and the CLI accept, for error messages."""
_NAMED_FORMS = "'<kind>/<name>' or '<namespace>/<kind>/<name>'"


def _no_slash_reason(text: str) -> str:
    """Why ``text`` (no ``/``, not a kind) is not a cluster, with the string the user probably meant."""
    kind, dash, rest = text.partition("-")
    if dash and rest and kind.lower() in ALLOWED_KINDS:
        short = normalize_kind(kind)
        # Domino names a run's cluster "<kind>-<run id>", so both readings are plausible.
        return f"use kind/name, e.g. '{short}/{rest}' (the cluster named {rest!r}) or '{short}/{text}'"
    return f"not a kind ({', '.join(KINDS)}) and no '/'; use kind/name, e.g. 'dask/{text}'"


def _cluster_parts(
    text: object, field: str, bare_kind: bool
) -> Tuple[Optional[str], str, Optional[str], Optional[str]]:
    """A cluster string's (namespace, kind, name, group), name None for a bare kind and group None without
    ``@``: its shape only (:class:`ClusterRef` checks the kind and name)."""
    forms = CLUSTER_FORMS if bare_kind else _NAMED_FORMS
    if not isinstance(text, str):
        raise InvalidInputError(field, text, forms, reason="not a string")
    if len(text) > MAX_CLUSTER_TEXT:
        raise InvalidInputError(
            field, text, forms, reason=f"longer than {MAX_CLUSTER_TEXT} characters (namespace/kind/name@group, each at most 63)"
        )
    if not text.strip():
        raise InvalidInputError(field, text, forms, reason="empty")
    parts = text.strip().split("/")
    if len(parts) == 1:
        if bare_kind and parts[0].strip().lower() in ALLOWED_KINDS:
            kind = normalize_kind(parts[0], field)
            if KINDS[kind].worker_groups:
                raise InvalidInputError(field, text, forms, reason=f"{kind} clusters need a name: use '{kind}/<name>'")
            return None, kind, None, None
        raise InvalidInputError(field, text, forms, reason=_no_slash_reason(parts[0]))
    if len(parts) > 3:
        raise InvalidInputError(field, text, forms, reason=f"{len(parts) - 1} '/' (at most 2)")
    labels = ("kind", "name") if len(parts) == 2 else ("namespace", "kind", "name")
    stripped = [part.strip() for part in parts]
    if "" in stripped:
        example = "dask/my-cluster"
        if stripped[0].lower() in ALLOWED_KINDS:
            # "dask//x" or "dask/" is a kind/name with the name left out, not a namespace "dask".
            labels = ("kind", "name", "name")
            filled = [part for part in stripped if part]
            if len(filled) == 2:
                example = "/".join(filled)
        label = labels[stripped.index("")]
        raise InvalidInputError(field, text, forms, reason=f"the {label} is empty; use kind/name, e.g. {example!r}")
    namespace, kind, name = (None, *parts) if len(parts) == 2 else parts
    base, _, group = name.partition(GROUP_SEPARATOR)
    return namespace, kind, base, group if GROUP_SEPARATOR in name else None


def check_cluster(text: str, field: str = "cluster") -> str:
    """A cluster string, checked and stripped, for definition time: a bare kind needs ``$DOMINO_RUN_ID``
    only when :func:`parse_cluster` resolves it."""
    namespace, kind, name, group = _cluster_parts(text, field, bare_kind=True)
    if name is not None:
        ClusterRef(kind, name, namespace, group)
    return text.strip()


ClusterSpec = Union[str, ClusterRef]
"""``kind/name``, ``namespace/kind/name``, a bare kind (the run's own cluster) or a ClusterRef."""


def cluster_text(cluster: ClusterSpec, field: str = "cluster") -> str:
    """Check ``cluster`` and return its text form, as task inputs and configurations carry it."""
    if isinstance(cluster, ClusterRef):
        return str(cluster)
    return check_cluster(cluster, field)


def parse_cluster(text: str, field: str = "cluster") -> ClusterRef:
    """The cluster a cluster string names (:data:`CLUSTER_FORMS`); a bare kind is the Domino run's own
    cluster ``<kind>-$DOMINO_RUN_ID``, and outside a run an :class:`InvalidInputError` asks for kind/name."""
    namespace, kind, name, group = _cluster_parts(text, field, bare_kind=True)
    if name is not None:
        return ClusterRef(kind, name, namespace, group)
    if not settings.DOMINO_RUN_ID.is_set():
        raise InvalidInputError(
            field, text, _NAMED_FORMS,
            reason=f"a bare kind names the Domino run's own cluster ({kind}-$DOMINO_RUN_ID), but "
            f"$DOMINO_RUN_ID is not set; give kind/name (e.g. '{kind}/my-cluster') outside a Domino run",
        )
    return ClusterRef.for_run(kind)
