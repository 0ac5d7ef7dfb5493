"""What every operator's objects share: pods read (Ready, terminating, failing, labels) and the size
records kept in a cluster object's annotations (:func:`encode_record`, :func:`decode_record`)."""
import json
from typing import Any, Dict, Optional, Tuple

from ..._core.records import BASELINE_ANNOTATION, decode_baseline, encode_baseline, json_object, mapping, only_fields, reading
from ..._core.validation import validate_int
from ...models import Baseline

FAILURE_REASONS = ("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "Unschedulable")
MAX_INT32 = 2**31 - 1
K8S_BASELINE_KEY = "kubernetes"
"""Key of the Kubernetes-only part of the baseline annotation (autoscaling section, tiers)."""
AUTOSCALING_FIELDS = (
    "averageCPUUtilization", "averageMemoryUtilization", "maxReplicas", "minReplicas",
    "scaleDownStabilizationWindowSeconds",
)
"""The fields of a DCO cluster's ``spec.autoscaling`` (the CRD's schema): all a recorded section may hold."""


def pod_ready(pod: Dict[str, Any]) -> bool:
    """True when the pod's Ready condition is True and it is not being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_terminating(pod: Dict[str, Any]) -> bool:
    """True when the pod has a deletionTimestamp."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pod_failure(pod: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """``(reason, message)`` when the pod cannot become Ready on its own, else None."""
    if pod_terminating(pod):
        return None
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return "Unschedulable", str(condition.get("message") or "")
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FAILURE_REASONS:
            return str(waiting["reason"]), str(waiting.get("message") or "")
    return None


def pod_labels(pod: Dict[str, Any]) -> Dict[str, str]:
    """The labels of ``pod`` (empty when it has none)."""
    return (pod.get("metadata") or {}).get("labels") or {}


def encode_record(baseline: Baseline, detail: Dict[str, Any]) -> str:
    """The baseline annotation: :func:`records.encode_baseline` fields plus the Kubernetes detail."""
    data = json.loads(encode_baseline(baseline))
    data[K8S_BASELINE_KEY] = detail
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def decode_record(
    obj: Dict[str, Any], annotation: str = BASELINE_ANNOTATION
) -> Optional[Tuple[Baseline, Dict[str, Any]]]:
    """The size recorded in ``annotation`` (the baseline, or the size outside phases) and its
    Kubernetes detail, or None when none is recorded.

    Checked as user input is: :class:`CorruptRecordError` names the annotation and the field.
    """
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(annotation)
    if not text:
        return None
    with reading(f"annotation {annotation}"):
        data = json_object(text, "record")
        detail = mapping(data.pop(K8S_BASELINE_KEY, None) or {}, K8S_BASELINE_KEY)
        if detail.get("autoscaling") is not None:
            check_autoscaling(detail["autoscaling"], f"{K8S_BASELINE_KEY}.autoscaling")
    baseline = decode_baseline(json.dumps(data), source=f"annotation {annotation}")
    assert baseline is not None
    return baseline, detail


def check_autoscaling(value: Any, where: str) -> Dict[str, Any]:
    """``value`` if it is an autoscaling section as the CRD allows (known fields, counts as integers)."""
    section = mapping(value, where)
    only_fields(section, AUTOSCALING_FIELDS, ("maxReplicas",), where)
    for key, number in section.items():
        validate_int(number, f"{where}.{key}", 1 if key.endswith("Replicas") else 0, MAX_INT32)
    return section
