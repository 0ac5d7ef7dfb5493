"""Domino's distributed-compute operator (RayCluster, SparkCluster, DaskCluster, MPICluster):
``spec.worker.replicas``, the HPA held by raising ``spec.autoscaling.minReplicas``; tiers set a section's
resources, node selector and tier label."""
from typing import Any, Dict, Optional, Tuple

from ....errors import CapacityExceededError
from ....models import ClusterState
from ....refs import ClusterRef
from ..._support.crds import LABEL_APP, LABEL_COMPONENT, LABEL_INSTANCE
from ...tiers import HardwareTier
from .._spec import (
    PARKED_AUTOSCALING_ANNOTATION,
    autoscaling_section,
    baseline_of,
    build_state,
    diff_map,
    is_worker,
    park_autoscaling,
    parked_autoscaling,
    restore_fragment,
    spec_section,
    tier_fragment,
)
from .base import Outcome, Patch, Pods, Record, ResourceAdapter, Restoring, Sizing


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
        return build_state(str(ref), self.layout, obj, pods)

    def baseline(self, ref: ClusterRef, obj: Dict[str, Any]) -> Record:
        return baseline_of(str(ref), self.layout, obj)

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
