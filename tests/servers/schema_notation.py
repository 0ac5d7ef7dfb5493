"""A compact notation for structural schemas, and its translation.

The Kubernetes test server validates and prunes custom resources with the
same structural-schema dicts a real API server derives from a CRD
(``openAPIV3Schema``). Writing those dicts by hand is long and hard to
review, so the facts are written one type per line instead::

    Toleration        effect key operator value tolerationSeconds:int64
    VolumeMount       mountPath! name! mountPropagation readOnly:bool subPath subPathExpr
    ScaledWorkload(Workload)  replicas:int32

A line starting in column 0 defines a type (``Name`` or ``Name(Base)``, which
starts from the base's fields); indented lines continue the previous type.
``#`` starts a comment. Each field is ``name``, ``name!`` (required) or
``name:type`` / ``name!:type``, where the type is:

=============  ============================================================
(none)         string
``int32``      integer (``int64`` likewise); booleans are not integers
``bool``       boolean
``bytes``      string in base64 (``format: byte``)
``datetime``   RFC 3339 string (``format: date-time``)
``object``     any object, kept as given (as ``metadata``)
``intstr``     integer or string
``quantity``   integer or a string that is a Kubernetes quantity (``500m``, ``2Gi``)
``[T]``        array of T (``[]``: array of strings)
``{T}``        map from string to T (``{}``: map from string to string)
``Name``       a type defined in the same notation
=============  ============================================================
"""
import copy
import re
from typing import Any, Dict, List, Tuple

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""What Kubernetes accepts as a resource quantity (``resource.Quantity``), as a string."""

_SCALARS: Dict[str, Dict[str, Any]] = {
    "": {"type": "string"},
    "int32": {"type": "integer", "format": "int32"},
    "int64": {"type": "integer", "format": "int64"},
    "bool": {"type": "boolean"},
    "bytes": {"type": "string", "format": "byte"},
    "datetime": {"type": "string", "format": "date-time"},
    "object": {"type": "object"},
    "intstr": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True},
    "quantity": {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
    },
}
_HEAD_RE = re.compile(r"^([A-Za-z][A-Za-z0-9]*)(?:\(([A-Za-z][A-Za-z0-9]*)\))?$")
_FIELD_RE = re.compile(r"^([A-Za-z][A-Za-z0-9]*)(!?)(?::(.+))?$")

Field = Tuple[str, bool, str]
"""``(name, required, type token)``."""


class NotationError(ValueError):
    """The notation text is malformed or names a type it does not define."""


def parse(text: str) -> Dict[str, List[Field]]:
    """The types defined in ``text``: ``{type name: [(field, required, type token), ...]}``.

    A derived type's list holds its base's fields first. Raises
    :class:`NotationError` on a malformed line, a duplicate type or field, or
    an unknown base.
    """
    types: Dict[str, List[Field]] = {}
    current = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        tokens = line.split()
        if not line[0].isspace():
            head = _HEAD_RE.match(tokens.pop(0))
            if head is None:
                raise NotationError(f"line {number}: expected 'Name' or 'Name(Base)', got {raw.split()[0]!r}")
            current, base = head.groups()
            if current in types:
                raise NotationError(f"line {number}: type {current} is defined twice")
            if base is not None and base not in types:
                raise NotationError(f"line {number}: base {base} of {current} must be defined above it")
            types[current] = list(types[base]) if base else []
        elif current is None:
            raise NotationError(f"line {number}: continuation line before any type")
        for token in tokens:
            field = _FIELD_RE.match(token)
            if field is None:
                raise NotationError(f"line {number}: malformed field {token!r} in {current}")
            name, required, kind = field.group(1), field.group(2) == "!", field.group(3) or ""
            if any(existing[0] == name for existing in types[current]):
                raise NotationError(f"line {number}: field {name} of {current} is defined twice")
            types[current].append((name, required, kind))
    return types


def to_schema(types: Dict[str, List[Field]], name: str) -> Dict[str, Any]:
    """The structural schema (``openAPIV3Schema`` shape) of type ``name``; a new dict each call.

    Raises :class:`NotationError` when a type token is malformed or names an undefined type.
    """
    if name not in types:
        raise NotationError(f"unknown type {name!r}")
    properties = {field: _type_schema(types, kind, f"{name}.{field}") for field, _, kind in types[name]}
    schema: Dict[str, Any] = {"type": "object", "properties": properties}
    required = sorted(field for field, is_required, _ in types[name] if is_required)
    if required:
        schema["required"] = required
    return schema


def _type_schema(types: Dict[str, List[Field]], token: str, where: str) -> Dict[str, Any]:
    if token in _SCALARS:
        return copy.deepcopy(_SCALARS[token])
    if token.startswith("[") and token.endswith("]"):
        return {"type": "array", "items": _type_schema(types, token[1:-1], where + "[]")}
    if token.startswith("{") and token.endswith("}"):
        return {"type": "object", "additionalProperties": _type_schema(types, token[1:-1], where + "{}")}
    if token in types:
        return to_schema(types, token)
    raise NotationError(f"{where}: unknown type {token!r}")
