"""Cluster objects and pods read, and the merge patches that change them: pure functions on the JSON
the API server speaks, so every patch can be checked without a server."""
import json
from typing import Any, Dict, Iterable, Optional, Tuple

from ...models import Baseline, ClusterState
from ..._core.records import json_object, mapping, only_fields, reading
from ..._core.records import ANNOTATION_PREFIX, BASELINE_ANNOTATION, decode_baseline, encode_baseline
from .._support.crds import LABEL_COMPONENT, LABEL_HW_TIER, NODE_POOL_SELECTOR, CrdLayout
from ..tiers import HardwareTier
from ..._core.validation import validate_int

FAILURE_REASONS = ("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "Unschedulable")
TIER_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
MAX_INT32 = 2**31 - 1
K8S_BASELINE_KEY = "kubernetes"
"""Key of the Kubernetes-only part of the baseline annotation (autoscaling section, tiers)."""
PARKED_AUTOSCALING_ANNOTATION = f"{ANNOTATION_PREFIX}/autoscaling"
"""The autoscaling section a restore to zero workers removed (the webhook forbids minReplicas 0)
while also dropping the baseline: kept so the next scale above zero can put it back."""
AUTOSCALING_FIELDS = (
    "averageCPUUtilization", "averageMemoryUtilization", "maxReplicas", "minReplicas",
    "scaleDownStabilizationWindowSeconds",
)
"""The fields of a DCO cluster's ``spec.autoscaling`` (the CRD's schema): all a recorded section may hold."""


def spec_section(obj: Dict[str, Any], name: Optional[str]) -> Dict[str, Any]:
    """``spec.<name>`` of a cluster object, or {} when absent or ``name`` is None."""
    if name is None:
        return {}
    return (obj.get("spec") or {}).get(name) or {}


def desired_workers(obj: Dict[str, Any]) -> int:
    """``spec.worker.replicas`` (the operator's default of 1 when unset)."""
    return int(spec_section(obj, "worker").get("replicas", 1))


def autoscaling_section(obj: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """``spec.autoscaling`` or None."""
    section = (obj.get("spec") or {}).get("autoscaling")
    return dict(section) if section else None


def tier_label(section: Dict[str, Any]) -> Optional[str]:
    """The hardware-tier-id label of a workload section."""
    return (section.get("labels") or {}).get(LABEL_HW_TIER)


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


def is_worker(pod: Dict[str, Any]) -> bool:
    """Whether the pod is a worker (component label ``worker``)."""
    return pod_labels(pod).get(LABEL_COMPONENT) == "worker"


def build_state(cluster: str, layout: CrdLayout, obj: Dict[str, Any], pods: Iterable[Dict[str, Any]]) -> ClusterState:
    """The :class:`ClusterState` of a cluster object and its pods."""
    workers = [p for p in pods if is_worker(p) and not pod_terminating(p)]
    heads = [p for p in pods if not is_worker(p)]
    auto = autoscaling_section(obj)
    return ClusterState(
        cluster=cluster,
        status=str((obj.get("status") or {}).get("clusterStatus") or "Unknown"),
        desired_workers=desired_workers(obj),
        existing_workers=len(workers),
        ready_workers=sum(1 for p in workers if pod_ready(p)),
        head_ready=None if layout.head_section is None else any(pod_ready(p) for p in heads),
        worker_hw_tier=tier_label(spec_section(obj, "worker")),
        head_hw_tier=tier_label(spec_section(obj, layout.head_section)),
        autoscaling_min=int(auto.get("minReplicas", 1)) if auto else None,
        autoscaling_max=int(auto["maxReplicas"]) if auto and auto.get("maxReplicas") is not None else None,
    )


def diff_map(current: Optional[Dict[str, Any]], wanted: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The merge-patch fragment that turns map ``current`` into exactly ``wanted``."""
    current, wanted = current or {}, wanted or {}
    patch: Dict[str, Any] = {k: None for k in current if k not in wanted}
    for key, value in wanted.items():
        old = current.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            nested = diff_map(old, value)
            if nested:
                patch[key] = nested
        elif old != value:
            patch[key] = value
    return patch


def tier_fragment(section: Dict[str, Any], tier: HardwareTier) -> Dict[str, Any]:
    """Merge-patch fragment putting a workload section on ``tier``.

    Sets cpu, memory and GPU requests/limits (removing a GPU the tier lacks,
    keeping unrelated resources), the node-pool selector, and the tier label.
    """
    wanted = tier.resources()
    resources = section.get("resources") or {}
    fragment: Dict[str, Any] = {}
    for part in ("requests", "limits"):
        current = resources.get(part) or {}
        target = {k: v for k, v in current.items() if k not in TIER_RESOURCES}
        target.update(wanted[part])
        change = diff_map(current, target)
        if change:
            fragment.setdefault("resources", {})[part] = change
    selector = diff_map(
        {NODE_POOL_SELECTOR: (section.get("nodeSelector") or {}).get(NODE_POOL_SELECTOR)},
        {NODE_POOL_SELECTOR: tier.node_pool},
    )
    if selector:
        fragment["nodeSelector"] = selector
    if tier_label(section) != tier.id:
        fragment["labels"] = {LABEL_HW_TIER: tier.id}
    return fragment


def section_record(section: Dict[str, Any]) -> Dict[str, Any]:
    """What the baseline keeps of a workload section: resources, node selector, tier label."""
    return {
        "resources": section.get("resources"),
        "nodeSelector": section.get("nodeSelector"),
        "tier": tier_label(section),
    }


def restore_fragment(section: Dict[str, Any], record: Dict[str, Any]) -> Dict[str, Any]:
    """Merge-patch fragment putting a workload section back to its :func:`section_record`."""
    fragment: Dict[str, Any] = {}
    for key in ("resources", "nodeSelector"):
        if record.get(key) is None:
            if section.get(key) is not None:
                fragment[key] = None
            continue
        change = diff_map(section.get(key), record[key])
        if change:
            fragment[key] = change
    if tier_label(section) != record.get("tier"):
        fragment["labels"] = {LABEL_HW_TIER: record.get("tier")}
    return fragment


def baseline_of(cluster: str, layout: CrdLayout, obj: Dict[str, Any]) -> Tuple[Baseline, Dict[str, Any]]:
    """The baseline of a cluster object as it is now, and its Kubernetes detail."""
    auto = autoscaling_section(obj)
    baseline = Baseline(
        cluster=cluster,
        replicas=desired_workers(obj),
        autoscaling_min=int(auto.get("minReplicas", 1)) if auto else None,
        autoscaling_max=int(auto["maxReplicas"]) if auto and auto.get("maxReplicas") is not None else None,
        worker_hw_tier=tier_label(spec_section(obj, "worker")),
        head_hw_tier=tier_label(spec_section(obj, layout.head_section)),
    )
    detail = {
        "autoscaling": auto,
        "worker": section_record(spec_section(obj, "worker")),
        "head": section_record(spec_section(obj, layout.head_section)) if layout.head_section else None,
    }
    return baseline, detail


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


def parked_autoscaling(obj: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The autoscaling section parked by a restore to zero workers, or None; checked as records are
    (:class:`CorruptRecordError` naming the annotation and field)."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(PARKED_AUTOSCALING_ANNOTATION)
    if not text:
        return None
    with reading(f"annotation {PARKED_AUTOSCALING_ANNOTATION}"):
        return check_autoscaling(json_object(text, "autoscaling"), "autoscaling")


def park_autoscaling(
    obj: Dict[str, Any], record: Optional[Tuple[Baseline, Dict[str, Any]]], spec: Dict[str, Any]
) -> Dict[str, Any]:
    """Annotation changes for a restore patch (it drops the baseline): when ``spec`` removes the
    autoscaling section, park the recorded one (else the current one) so it is not lost; when
    ``spec`` puts a section back, forget a parked one."""
    if "autoscaling" not in spec:
        return {}
    if spec["autoscaling"] is not None:
        return {PARKED_AUTOSCALING_ANNOTATION: None} if parked_autoscaling(obj) is not None else {}
    keep = (record[1].get("autoscaling") if record else None) or autoscaling_section(obj)
    return {PARKED_AUTOSCALING_ANNOTATION: json.dumps(keep, separators=(",", ":"), sort_keys=True)} if keep else {}
