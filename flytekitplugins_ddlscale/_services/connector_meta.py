"""What the Flyte connector's ``create`` hands to ``get``: the resource metadata, checked like input (an
unreadable one polls FAILED naming the field). Fields a version does not know are kept as they came, so
versions before and after read each other's (a rolling update, a rollback).
"""
import json
import math
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Dict, Sequence, Tuple, Type

from flytekit.extend.backend.base_connector import ResourceMeta

from ..errors import InvalidInputError, ScalingError
from ..models import RestartResult
from .nodes import NODE_KINDS
from .nodes.kinds import AWAIT_WORKERS, AWAITS, RESTART_FIELDS


try:
    WRITER = version("flytekitplugins-ddlscale")
    """The installed plugin's version: who wrote a metadata (:attr:`ScalingMetadata.writer`)."""
except PackageNotFoundError:  # run from a source tree that is not installed
    WRITER = "unknown"

MAX_META_BYTES = 64 * 1024
"""Largest resource metadata read back: ``create`` writes well under 4 KB (names and URLs are bounded)."""

MAX_VERSION_CHARS = 64
"""Longest cluster version read back (a Kubernetes resourceVersion is an etcd revision: about 10 digits)."""

_TYPE_WORDS = {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}


@dataclass
class ScalingMetadata(ResourceMeta):
    """What ``create`` sent and what ``get`` waits for: enough to decide without any other state."""

    task_type: str
    cluster: str
    backend: str
    """The template's backend ('' for the connector's own choice)."""
    target: int
    """Workers to wait for; -1 means nothing to wait for."""
    started: float
    """Epoch seconds when the change was sent."""
    deadline: float
    """Epoch seconds after which ``get`` reports failure."""
    outcome: str
    """JSON of the node's outcome as known at creation (completed by ``get``)."""
    framework_ready: bool = True
    framework_url: str = ""
    """The node's ``framework_url`` ('' for none)."""
    error: str = ""
    """Why the node was refused ('' when it was not): ``get`` reports it as FAILED."""
    awaits: str = AWAIT_WORKERS
    """What ``get`` waits for: one of :data:`AWAITS`."""
    restart: str = ""
    """JSON of the head restart ``create`` sent (pod, started_at, head_hw_tier, replaced_uid); '' for none."""
    pending: str = ""
    """JSON of the change ``create`` could not send for a backend outage (``{"custom": the node's
    configuration, "inputs": its inputs}``), which the polls send; '' once ``create`` sent it."""
    cluster_version: str = ""
    """The version of the cluster's object as ``create`` left it ('' where the backend keeps none): another
    connector replica answers from its cache only once the cache holds that version."""
    project: str = ""
    """The Flyte project the node ran for ('' where not known): its metrics' label."""
    writer: str = WRITER
    """The plugin version that wrote it ('' when written before versions were recorded)."""
    unknown: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """Fields a later version wrote that this one does not know: kept, and written back by :meth:`encode`."""

    def encode(self) -> bytes:
        """The JSON FlytePropeller keeps: every field, and the unknown ones as they came."""
        known = asdict(self)
        known.pop("unknown")
        return json.dumps({**self.unknown, **known}).encode("utf-8")

    @classmethod
    def refused(cls, task_type: str, error: ScalingError) -> "ScalingMetadata":
        """A metadata whose ``get`` fails at once with ``error``'s one-line message."""
        now = time.time()
        return cls(task_type, "", "", -1, now, now, "{}", error=str(error))

    @classmethod
    def decode(cls, data: bytes) -> "ScalingMetadata":
        """The metadata in ``data``; a refused one (saying which field is wrong) when it is malformed,
        so the caller gets a short FAILED answer instead of a traceback."""
        raw: Any = None
        try:
            if len(data) > MAX_META_BYTES:
                raise InvalidInputError(
                    "resource_meta", f"<{len(data)} bytes>", f"the JSON that create returned (at most {MAX_META_BYTES} bytes)"
                )
            raw = json.loads(data.decode("utf-8"))
            if not isinstance(raw, dict):
                raise InvalidInputError("resource_meta", type(raw).__name__, "a JSON object")
            names = {f.name for f in fields(cls)} - {"unknown"}
            values: Dict[str, Any] = {f.name: checked_value(f"resource_meta.{f.name}", f.type, raw[f.name])
                                      for f in fields(cls) if f.name in names and f.name in raw}
            values.setdefault("writer", "")
            values["unknown"] = {key: value for key, value in raw.items() if key not in names}
            _require("resource_meta", cls, values)
            if values.get("awaits", AWAIT_WORKERS) not in AWAITS:
                raise InvalidInputError("resource_meta.awaits", values["awaits"], ", ".join(AWAITS))
            _check_version(values.get("cluster_version", ""))
            return cls(**values)
        except ScalingError as error:
            return cls.refused(str(raw.get("task_type", "")) if isinstance(raw, dict) else "", error)
        except (ValueError, RecursionError):
            # RecursionError: JSON nested deeper than the parser's stack.
            return cls.refused("", InvalidInputError("resource_meta", "<not JSON>", "the JSON that create returned"))
        except Exception as error:  # decoded by the connector server, outside any connector call's edge
            return cls.refused("", InvalidInputError("resource_meta", f"<{type(error).__name__}>", "the JSON that create returned"))

    def known_outcome(self) -> Dict[str, Any]:
        """The outcome fields ``create`` knew, each checked against the task type's outcome class."""
        node_kind = NODE_KINDS.get(self.task_type)
        if node_kind is None:
            raise InvalidInputError("resource_meta.task_type", self.task_type, ", ".join(NODE_KINDS))
        kind = node_kind.output
        known = _json_object("resource_meta.outcome", self.outcome)
        types = {f.name: f.type for f in fields(kind)}
        unknown = sorted(set(known) - set(types))
        if unknown:
            raise InvalidInputError(f"resource_meta.outcome.{unknown[0]}", known[unknown[0]], ", ".join(types))
        return {name: checked_value(f"resource_meta.outcome.{name}", types[name], value) for name, value in known.items()}

    def outcome_of(self, **updates: Any) -> Any:
        """The task type's outcome from what ``create`` knew, with ``updates`` (what ``get`` saw)."""
        kind = NODE_KINDS[self.task_type].output
        values = {**self.known_outcome(), **updates}
        _require("resource_meta.outcome", kind, values)
        return kind(**values)

    def pending_change(self, inputs: Sequence[str]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """The configuration and the input values (named in ``inputs``) of the change ``create`` left
        to the polls, each part checked to be a JSON object of known names (the configuration's own
        fields are checked when it is built from it)."""
        known = _json_object("resource_meta.pending", self.pending)
        parts = []
        for part in ("custom", "inputs"):
            value = known.get(part)
            if not isinstance(value, dict):
                raise InvalidInputError(f"resource_meta.pending.{part}", type(value).__name__, "a JSON object")
            parts.append(value)
        custom, values = parts
        unknown = sorted(set(values) - set(inputs))
        if unknown:
            raise InvalidInputError(f"resource_meta.pending.inputs.{unknown[0]}", values[unknown[0]], ", ".join(inputs))
        return custom, values

    def sent_restart(self) -> RestartResult:
        """The head restart ``create`` sent, as the backend returned it (``final`` is not kept)."""
        known = _json_object("resource_meta.restart", self.restart)
        values = {}
        for name in RESTART_FIELDS:
            value = known.get(name, "")
            values[name] = checked_value(f"resource_meta.restart.{name}", str, "" if value is None else value)
        if not values["started_at"]:
            raise InvalidInputError("resource_meta.restart.started_at", None, "the value create returned (required)")
        return RestartResult(
            cluster=self.cluster, pod=values["pod"], started_at=values["started_at"], ready=False, final=None,  # type: ignore[arg-type]
            waited=False, head_hw_tier=values["head_hw_tier"] or None, replaced_uid=values["replaced_uid"],
        )


def _check_version(version: str) -> None:
    """A cluster version as a backend gives one (a resourceVersion: opaque, short, printable ASCII without
    spaces), else :class:`InvalidInputError` naming the field."""
    if len(version) > MAX_VERSION_CHARS or not all("!" <= char <= "~" for char in version):
        raise InvalidInputError(
            "resource_meta.cluster_version", version[:MAX_VERSION_CHARS + 1],
            f"'' or the version create returned (at most {MAX_VERSION_CHARS} printable ASCII characters, no spaces)",
        )


def _require(where: str, cls: Type, values: Dict[str, Any]) -> None:
    """:class:`InvalidInputError` naming the first field of ``cls`` without a default missing from ``values``."""
    for f in fields(cls):
        if f.name not in values and f.default is MISSING:
            raise InvalidInputError(f"{where}.{f.name}", None, "the value create returned (required)")


def _json_object(field: str, text: str) -> Dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidInputError(field, "<not JSON>", "the JSON that create returned") from None
    if not isinstance(value, dict):
        raise InvalidInputError(field, type(value).__name__, "a JSON object")
    return value


def checked_value(field: str, kind: Type, value: Any) -> Any:
    """``value`` if it has type ``kind`` (whole floats pass as int, ints as float), else
    :class:`InvalidInputError` naming ``field``; floats must be finite."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if not ok or (kind is float and not math.isfinite(value)):
        raise InvalidInputError(field, type(value).__name__, _TYPE_WORDS.get(kind, str(kind)))
    return value
