"""Turn the scaler service's error answers into the plugin's typed errors.

The service answers ``{"error": <code>, "message": ...}`` (plus ``details``,
the Kubernetes exception text, on 500s). A missing cluster is a 500
``get_failed``/``scale_failed`` whose details carry the Kubernetes 404; that
is the only way to tell "not found" from a real server failure.
"""
import re
from typing import Any, Dict, Optional

import httpx

from ...errors import (
    BackendUnavailableError,
    ClusterNotFoundError,
    InvalidInputError,
    NotScalableError,
    ScalingError,
    UnauthorizedError,
    UnknownTierError,
)
from ...refs import ClusterRef

SERVED_PLURALS = "rayclusters, sparkclusters, daskclusters"
_K8S_NOT_FOUND = re.compile(r"^\(404\)|\"reason\":\s*\"NotFound\"|\"code\":\s*404")


def response_body(response: httpx.Response) -> Dict[str, Any]:
    """The JSON object of ``response``, or ``{}`` when it is not a JSON object."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def error_from_response(
    response: httpx.Response,
    ref: ClusterRef,
    *,
    operation: str,
    bad_request_field: str = "replicas",
    bad_request_value: Optional[object] = None,
) -> ScalingError:
    """The typed error for a non-success answer to ``operation`` on ``ref``."""
    status = response.status_code
    body = response_body(response)
    code = str(body.get("error") or body.get("status") or f"http_{status}")
    said = body.get("message") or body.get("error") or response.reason_phrase
    where = str(ref)
    text = f"{operation} failed: {said}"
    if status == 400 and code == "invalid_kind":
        return InvalidInputError("kind", ref.plural, SERVED_PLURALS)
    if status == 400 and code == "invalid_hw_tier":
        return UnknownTierError(text, code=code, status_code=status, cluster=where)
    if status == 400:
        return InvalidInputError(bad_request_field, bad_request_value, f"what the service accepts ({said})")
    if status in (401, 403):
        return UnauthorizedError(
            f"{text}; the caller must be a Domino admin or the cluster's owner",
            code=code,
            status_code=status,
            cluster=where,
        )
    if status == 409:
        return NotScalableError(text, code=code, status_code=status, cluster=where)
    if status == 404 or (status == 500 and _K8S_NOT_FOUND.search(str(body.get("details") or ""))):
        return ClusterNotFoundError(
            f"{operation} failed: {ref.plural}/{ref.name} does not exist in the service's namespace",
            code="not_found",
            status_code=status,
            cluster=where,
        )
    if status in (502, 503, 504):
        return BackendUnavailableError(text, code=code, status_code=status, cluster=where)
    return ScalingError(text, code=code, status_code=status, cluster=where)
