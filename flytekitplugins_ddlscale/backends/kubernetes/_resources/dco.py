"""Domino's distributed-compute operator (RayCluster, SparkCluster, DaskCluster, MPICluster):
``spec.worker.replicas``, the HPA held by raising ``spec.autoscaling.minReplicas``; tiers set a section's
resources, node selector and tier label."""
import json
from typing import Any, Dict, Optional, Tuple

from ....errors import CapacityExceededError
from ....models import Baseline, ClusterState
from ...._core.records import ANNOTATION_PREFIX, json_object, reading
from ....refs import ClusterRef
from ..._support.crds import LABEL_APP, LABEL_COMPONENT, LABEL_HW_TIER, LABEL_INSTANCE, NODE_POOL_SELECTOR
from ...tiers import HardwareTier
from .._spec import check_autoscaling, pod_labels, pod_ready, pod_terminating
from .base import Outcome, Patch, Pods, Record, ResourceAdapter, Restoring, Sizing

TIER_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
PARKED_AUTOSCALING_ANNOTATION = f"{ANNOTATION_PREFIX}/autoscaling"
"""The autoscaling section a restore to zero workers removed (the webhook forbids minReplicas 0)
while also dropping the baseline: kept so the next scale above zero can put it back."""


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


def is_worker(pod: Dict[str, Any]) -> bool:
    """Whether the pod is a worker (component label ``worker``)."""
    return pod_labels(pod).get(LABEL_COMPONENT) == "worker"


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


class DcoAdapter(ResourceAdapter):
    """The DCO custom resources, as the backend always patched them."""

    tiers = True

    def pod_selector(self, ref: ClusterRef, role: Optional[str] = None) -> str:
        parts = [f"{LABEL_APP}={self.layout.app}", f"{LABEL_INSTANCE}={ref.name}"]
        component = self.layout.head_component if role == "head" else role
        if component:
            parts.append(f"{LABEL_COMPONENT}={component}")
        return ",".join(parts)

    def is_worker(self, pod: Dict[str, Any]) -> bool:
        return is_worker(pod)

    def state(self, ref: ClusterRef, obj: Dict[str, Any], pods: Pods) -> ClusterState:
        workers = [p for p in pods if is_worker(p) and not pod_terminating(p)]
        heads = [p for p in pods if not is_worker(p)]
        auto, head_section = autoscaling_section(obj), self.layout.head_section
        return ClusterState(
            cluster=str(ref),
            status=str((obj.get("status") or {}).get("clusterStatus") or "Unknown"),
            desired_workers=desired_workers(obj),
            existing_workers=len(workers),
            ready_workers=sum(1 for p in workers if pod_ready(p)),
            head_ready=None if head_section is None else any(pod_ready(p) for p in heads),
            worker_hw_tier=tier_label(spec_section(obj, "worker")),
            head_hw_tier=tier_label(spec_section(obj, head_section)),
            autoscaling_min=int(auto.get("minReplicas", 1)) if auto else None,
            autoscaling_max=int(auto["maxReplicas"]) if auto and auto.get("maxReplicas") is not None else None,
        )

    def baseline(self, ref: ClusterRef, obj: Dict[str, Any]) -> Record:
        """The recorded size, bounds and tiers, with what a restore puts back: the autoscaling section and
        each section's resources, node selector and tier."""
        state, head_section = self.state(ref, obj, []), self.layout.head_section
        baseline = Baseline(
            cluster=str(ref), replicas=state.desired_workers, worker_hw_tier=state.worker_hw_tier,
            head_hw_tier=state.head_hw_tier, autoscaling_min=state.autoscaling_min,
            autoscaling_max=state.autoscaling_max,
        )
        return baseline, {
            "autoscaling": autoscaling_section(obj),
            "worker": section_record(spec_section(obj, "worker")),
            "head": section_record(spec_section(obj, head_section)) if head_section else None,
        }

    def size_spec(
        self, ref: ClusterRef, obj: Dict[str, Any], sizing: Sizing, pods: Pods, record: Optional[Record]
    ) -> Tuple[Patch, int, bool]:
        replicas, tier = sizing.replicas, sizing.tier
        auto = autoscaling_section(obj)
        recorded = record[1].get("autoscaling") if record else parked_autoscaling(obj)
        bounds = auto or (recorded if replicas > 0 else None)
        effective, capped = replicas, False
        if bounds and bounds.get("maxReplicas") is not None and replicas > int(bounds["maxReplicas"]):
            limit = int(bounds["maxReplicas"])
            if sizing.strict:
                raise CapacityExceededError(
                    f"{replicas} workers requested but maxReplicas is {limit} (strict mode)", cluster=str(ref),
                )
            effective, capped = limit, True
        spec: Patch = {"worker": {"replicas": effective}}
        if self.layout.autoscaling:
            if auto and effective == 0:
                # The webhook forbids minReplicas 0, so zero workers means no autoscaling for now.
                spec["autoscaling"] = None
            elif auto and int(auto.get("minReplicas", 1)) != effective:
                spec["autoscaling"] = {"minReplicas": effective}
            elif not auto and recorded and effective > 0:
                spec["autoscaling"] = dict(recorded, minReplicas=effective)
        if tier is not None:
            spec["worker"].update(tier_fragment(spec_section(obj, "worker"), tier))
        return spec, effective, capped

    def recorded_spec(self, ref: ClusterRef, obj: Dict[str, Any], record: Record, outcome: Outcome, pods: Pods) -> Patch:
        baseline, detail = record
        spec: Patch = {"worker": {"replicas": baseline.replicas}}
        outcome.effective = baseline.replicas
        if self.layout.autoscaling:
            recorded, current = detail.get("autoscaling"), autoscaling_section(obj)
            if recorded is None and current is not None:
                spec["autoscaling"] = None
            elif recorded is not None:
                spec["autoscaling"] = diff_map(current, recorded) if current else recorded
        return spec

    def restored_tiers(
        self, obj: Dict[str, Any], spec: Patch, record: Optional[Record], restoring: Restoring, outcome: Outcome
    ) -> Patch:
        layout, worker_tier, head_tier = self.layout, restoring.worker_tier, restoring.head_tier
        worker = spec_section(obj, "worker")
        head = spec_section(obj, layout.head_section)
        if worker_tier is not None:
            spec["worker"].update(tier_fragment(worker, worker_tier))
            outcome.tier = worker_tier.id
        elif record is not None and record[1].get("worker"):
            spec["worker"].update(restore_fragment(worker, record[1]["worker"]))
            outcome.tier = record[1]["worker"].get("tier")
        head_fragment: Patch = {}
        if head_tier is not None:
            head_fragment = tier_fragment(head, head_tier)
        elif record is not None and record[1].get("head"):
            head_fragment = restore_fragment(head, record[1]["head"])
        if head_fragment and layout.head_section:
            spec[layout.head_section] = head_fragment
        return spec

    def notes(self, obj: Dict[str, Any], record: Optional[Record], spec: Patch, restoring: bool) -> Dict[str, Any]:
        """A restore that drops the baseline parks an autoscaling section it removes; a change
        that puts a section back forgets the parked one."""
        if restoring:
            return park_autoscaling(obj, record, spec)
        if parked_autoscaling(obj) is not None and spec.get("autoscaling"):
            return {PARKED_AUTOSCALING_ANNOTATION: None}
        return {}

    def head_tier_spec(self, obj: Dict[str, Any], tier: HardwareTier) -> Optional[Patch]:
        assert self.layout.head_section is not None
        fragment = tier_fragment(spec_section(obj, self.layout.head_section), tier)
        return {self.layout.head_section: fragment} if fragment else None
