"""Read a cluster's custom object, as the scaler service returns it, into a :class:`ClusterState`.

What the service cannot show: pod readiness. It returns only the custom
object, whose ``status.nodes`` lists pod names. So ``existing_workers`` counts
the names with this kind's worker prefix and ``ready_workers`` is None;
``head_ready`` is True only while ``clusterStatus`` is Running (which the
operator sets when the head pod is Ready) and unknown otherwise.
"""
from typing import Any, Dict, Optional

from ...models import ClusterState
from ...refs import ClusterRef
from .._support.crds import LABEL_HW_TIER, layout_of


def _int_or_none(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def state_from_object(ref: ClusterRef, obj: Dict[str, Any]) -> ClusterState:
    """The observable state of ``ref`` in the custom object ``obj``."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    worker = spec.get("worker") or {}
    head = spec.get(layout_of(ref).head_section or "", {}) or {}
    autoscaling = spec.get("autoscaling")
    prefix = layout_of(ref).worker_pod_prefix(ref.name)
    nodes = status.get("nodes") or []
    cluster_status = status.get("clusterStatus") or "Unknown"
    return ClusterState(
        cluster=str(ref),
        status=cluster_status,
        desired_workers=_int_or_none(worker.get("replicas")) or 0,
        existing_workers=sum(1 for node in nodes if isinstance(node, str) and node.startswith(prefix)),
        ready_workers=None,
        head_ready=True if cluster_status == "Running" and layout_of(ref).head_section else None,
        worker_hw_tier=(worker.get("labels") or {}).get(LABEL_HW_TIER),
        head_hw_tier=(head.get("labels") or {}).get(LABEL_HW_TIER),
        autoscaling_min=_int_or_none(autoscaling.get("minReplicas")) if isinstance(autoscaling, dict) else None,
        autoscaling_max=_int_or_none(autoscaling.get("maxReplicas")) if isinstance(autoscaling, dict) else None,
    )
