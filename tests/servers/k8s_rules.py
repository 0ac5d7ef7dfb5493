"""What a real Kubernetes API server (plus the DCO admission webhook) enforces.

Pure functions used by :mod:`k8s_server`: JSON merge patch (RFC 7386), JSON
patch (RFC 6902), label selectors, structural-schema pruning and validation
against the DCO CRD schemas of :mod:`dco_crds`, and the operator webhook's rules.
"""
import copy
import json
import re
from typing import Any, Dict, List, Optional, Tuple

import jsonschema


class ApiError(Exception):
    """An API-server refusal: HTTP status, Status reason and message."""

    def __init__(self, code: int, reason: str, message: str, details: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> Dict[str, Any]:
        """The ``Status`` object a real server returns for this error."""
        body: Dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> List[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: List[str]) -> Any:
    for part in parts:
        if isinstance(doc, list):
            doc = doc[int(part)]
        else:
            doc = doc[part]
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test, copy, move); 422 on a failed op."""
    if not isinstance(operations, list):
        raise ApiError(400, "BadRequest", "json patch body must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        try:
            kind, parts = op["op"], _pointer(op["path"])
            if kind == "test":
                if _walk(doc, parts) != op["value"]:
                    raise ApiError(422, "Invalid", f"testing value {op['path']} failed")
                continue
            if kind in ("copy", "move"):
                value = copy.deepcopy(_walk(doc, _pointer(op["from"])))
                if kind == "move":
                    doc = _remove(doc, _pointer(op["from"]))
                doc = _add(doc, parts, value)
            elif kind == "add":
                doc = _add(doc, parts, copy.deepcopy(op["value"]))
            elif kind == "remove":
                doc = _remove(doc, parts)
            elif kind == "replace":
                doc = _add(_remove(doc, parts), parts, copy.deepcopy(op["value"]))
            else:
                raise ApiError(400, "BadRequest", f"unknown json patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, "Invalid", f"json patch {op!r} failed: {exc!r}") from None
    return doc


def _add(doc: Any, parts: List[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    if isinstance(parent, list):
        index = len(parent) if parts[-1] == "-" else int(parts[-1])
        parent.insert(index, value)
    else:
        parent[parts[-1]] = value
    return doc


def _remove(doc: Any, parts: List[str]) -> Any:
    parent = _walk(doc, parts[:-1])
    if isinstance(parent, list):
        parent.pop(int(parts[-1]))
    else:
        del parent[parts[-1]]
    return doc


_REQ_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def parse_selector(text: Optional[str]) -> List[Tuple[str, str, Tuple[str, ...]]]:
    """Parse a label selector into ``(key, op, values)`` requirements; 400 when malformed."""
    if not text:
        return []
    requirements = []
    for part in re.split(r",(?![^()]*\))", text):
        part = part.strip()
        match = _REQ_RE.match(part)
        if match:
            values = tuple(v.strip() for v in match.group(3).split(",") if v.strip())
            requirements.append((match.group(1), match.group(2), values))
        elif "!=" in part:
            key, value = part.split("!=", 1)
            requirements.append((key.strip(), "!=", (value.strip(),)))
        elif "=" in part:
            key, value = part.replace("==", "=").split("=", 1)
            requirements.append((key.strip(), "=", (value.strip(),)))
        elif part.startswith("!") and len(part) > 1:
            requirements.append((part[1:], "!", ()))
        elif part and re.match(r"^[A-Za-z0-9./_-]+$", part):
            requirements.append((part, "exists", ()))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return requirements


def selector_matches(requirements: List[Tuple[str, str, Tuple[str, ...]]], labels: Dict[str, str]) -> bool:
    """Whether ``labels`` satisfy every requirement."""
    for key, op, values in requirements:
        present = key in labels
        if op in ("=", "in") and (not present or labels[key] not in values):
            return False
        if op in ("!=", "notin") and present and labels[key] in values:
            return False
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
    return True


def prune(obj: Any, schema: Dict[str, Any]) -> Any:
    """Drop fields the structural schema does not declare, as the API server does."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return obj
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is None and isinstance(extra, dict):
            return {k: prune(v, extra) for k, v in obj.items()}
        if props is None:
            return obj
        return {k: prune(v, props[k]) for k, v in obj.items() if k in props}
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [prune(item, schema["items"]) for item in obj]
    return obj


def _int_or_string(validator: Any, value: Any, instance: Any, schema: Dict[str, Any]) -> Any:
    if value and not isinstance(instance, (int, str)):
        yield jsonschema.ValidationError(f"{instance!r} is not an int or string")


_Validator = jsonschema.validators.extend(
    jsonschema.Draft4Validator, {"x-kubernetes-int-or-string": _int_or_string}
)


def validate_object(
    obj: Dict[str, Any], schema: Dict[str, Any], kind: str, group: str = "distributed-compute.dominodatalab.com",
    scale_path: Optional[str] = None,
) -> None:
    """422 Invalid, with field causes worded as kube-apiserver words them, when ``obj`` breaks the CRD schema
    or, for a CRD with a ``scale`` subresource, holds no valid replica count at its ``specReplicasPath``
    ``scale_path`` (checked by the API server itself, before any admission webhook)."""
    errors = sorted(_Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
    causes: List[Dict[str, str]] = []
    for error in errors:
        for cause in _causes(error):
            if cause not in causes:
                causes.append(cause)
    if scale_path is not None:
        causes.extend(_scale_causes(obj, scale_path))
    if causes:
        text = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
        name = obj.get("metadata", {}).get("name")
        raise ApiError(
            422,
            "Invalid",
            f'{kind}.{group} "{name}" is invalid: ' + (f"[{text}]" if len(causes) > 1 else text),
            {"name": name, "group": group, "kind": kind, "causes": causes},
        )


def _scale_causes(obj: Dict[str, Any], path: str) -> List[Dict[str, str]]:
    """kube-apiserver's check of a scale subresource's ``specReplicasPath`` (measured on v1.24): absent is
    fine; otherwise an int64 from 0 to 2147483647."""
    value: Any = obj
    for key in path.strip(".").split("."):
        if not isinstance(value, dict) or key not in value:
            return []
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int):
        shown = json.dumps(value) if not isinstance(value, str) else value
        go_type = {bool: "bool", float: "float64", str: "string"}.get(type(value), "map[string]interface {}")
        message = f"Invalid value: 0: {path} accessor error: {shown} is of the type {go_type}, expected int64"
    elif value < 0:
        message = f"Invalid value: {value}: should be a non-negative integer"
    elif value > 2147483647:
        message = f"Invalid value: {value}: should be less than or equal to 2147483647"
    else:
        return []
    return [{"reason": "FieldValueInvalid", "field": path, "message": message}]


_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (dict, "object"),
               (list, "array"))


def _causes(error: Any) -> List[Dict[str, str]]:
    """One schema error as kube-apiserver (v1.24, measured on the envtest tier) reports it: a missing field
    under its own path (FieldValueRequired, "Required value"), a wrong type as FieldValueTypeInvalid naming
    both types, a pattern as "should match"; other checks keep the validator's words."""
    path = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "required":
        missing = [p for p in error.validator_value if isinstance(error.instance, dict) and p not in error.instance]
        return [{"reason": "FieldValueRequired", "field": f"{path}.{p}" if path else p, "message": "Required value"}
                for p in missing]
    if error.validator == "type":
        actual = next(name for kind, name in _JSON_TYPES if isinstance(error.instance, kind)) \
            if error.instance is not None else "null"
        return [{"reason": "FieldValueTypeInvalid", "field": path,
                 "message": f'Invalid value: "{actual}": {path} in body must be of type '
                            f'{error.validator_value}: "{actual}"'}]
    if error.validator == "pattern":
        return [{"reason": "FieldValueInvalid", "field": path,
                 "message": f"Invalid value: {json.dumps(error.instance)}: {path} in body should match "
                            f"'{error.validator_value}'"}]
    return [{"reason": "FieldValueInvalid", "field": path, "message": f"Invalid value: {error.message}"}]


def webhook_name(kind: str) -> str:
    """The name the DCO's validating webhook for ``kind`` (``RayCluster``...) is registered under."""
    return f"v{kind.lower()}.distributed-compute.dominodatalab.com"


def webhook_problems(obj: Dict[str, Any]) -> List[str]:
    """What the DCO validating webhook refuses in ``obj`` (empty when it admits it): autoscaling bounds,
    replicas >= 0, worker cpu/memory requests."""
    spec = obj.get("spec") or {}
    problems = []
    auto = spec.get("autoscaling")
    if auto is not None:
        low, high = auto.get("minReplicas"), auto.get("maxReplicas")
        if low is not None and low < 1:
            problems.append(f"spec.autoscaling.minReplicas: Invalid value: {low}: must be greater than or equal to 1")
        if high is not None and high < 1:
            problems.append(f"spec.autoscaling.maxReplicas: Invalid value: {high}: must be greater than or equal to 1")
        if low is not None and high is not None and low > high:
            problems.append(
                f"spec.autoscaling.minReplicas: Invalid value: {low}: cannot be greater than maxReplicas ({high})"
            )
    worker = spec.get("worker") or {}
    replicas = worker.get("replicas")
    if replicas is not None and replicas < 0:
        problems.append(f"spec.worker.replicas: Invalid value: {replicas}: must be greater than or equal to 0")
    requests = ((worker.get("resources") or {}).get("requests")) or {}
    for resource in ("cpu", "memory"):
        if resource not in requests:
            problems.append(f"spec.worker.resources.requests.{resource}: Required value: must be set")
    return problems


def webhook_denial(obj: Dict[str, Any], kind: str, problems: List[str]) -> str:
    """The webhook's own message for ``problems`` (the API server prefixes it with who denied the request)."""
    name = obj.get("metadata", {}).get("name")
    return f'{kind}.distributed-compute.dominodatalab.com "{name}" is invalid: ' + "; ".join(problems)


def webhook_check(obj: Dict[str, Any], kind: str) -> None:
    """The DCO validating webhook as the API server reports its refusal: 422 Invalid,
    ``admission webhook "<name>" denied the request: <the webhook's message>``."""
    problems = webhook_problems(obj)
    if problems:
        raise ApiError(
            422,
            "Invalid",
            f'admission webhook "{webhook_name(kind)}" denied the request: {webhook_denial(obj, kind, problems)}',
        )
