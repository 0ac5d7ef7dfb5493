"""KubeRay's and the Dask operator's custom resources, as the Kubernetes test server knows them.

Facts read from the published CRDs and written here in our own notation
(:mod:`schema_notation`):

- KubeRay ``rayclusters.ray.io`` (``ray.io/v1``, KubeRay 1.4 layout: ``rayStartParams``
  optional): ``spec.headGroupSpec`` (required ``template``) and
  ``spec.workerGroupSpecs[]`` (required ``groupName`` and ``template``; ``replicas``,
  ``minReplicas``, ``maxReplicas``, ``scaleStrategy.workersToDelete``), a
  ``status`` subresource and NO ``scale`` subresource.
- Dask operator ``daskclusters``, ``daskworkergroups``, ``daskautoscalers``
  (``kubernetes.dask.org/v1``): a DaskCluster needs ``spec.scheduler`` (``spec`` and
  ``service``) and ``spec.worker`` (``spec``; ``replicas`` defaults to 1); a
  DaskWorkerGroup needs ``spec.cluster`` and ``spec.worker``; a DaskAutoscaler needs
  ``spec.cluster``, ``spec.minimum`` and ``spec.maximum``. DaskCluster (``.spec.replicas``) and
  DaskWorkerGroup (``.spec.worker.replicas``) have a ``scale`` subresource and no
  ``status`` subresource; their status is written with the main resource.

Left out: pod templates and pod specs are kept as given (``object``), not
validated field by field as the real CRDs do; ``default`` values are not applied
(the backend reads an absent ``replicas``/``minReplicas`` as the CRD default); the
``status`` of DaskCluster and DaskWorkerGroup is typed loosely (preserve unknown fields).
"""
from dataclasses import dataclass
from typing import Any, Dict, Optional

from .schema_notation import parse, to_schema

TYPES = parse(
    """
Object               apiVersion kind metadata:object

# --- KubeRay (ray.io/v1) ---
HeadGroupSpec        enableIngress:bool headService:object rayStartParams:{} serviceType template!:object
ScaleStrategy        workersToDelete:[]
WorkerGroupSpec      groupName! idleTimeoutSeconds:int32 maxReplicas:int32 minReplicas:int32 numOfHosts:int32
                     rayStartParams:{} replicas:int32 scaleStrategy:ScaleStrategy suspend:bool template!:object
RayClusterSpec       autoscalerOptions:object enableInTreeAutoscaling:bool gcsFaultToleranceOptions:object
                     headGroupSpec!:HeadGroupSpec headServiceAnnotations:{} managedBy rayVersion suspend:bool
                     workerGroupSpecs:[WorkerGroupSpec]
RayHeadInfo          podIP podName serviceIP serviceName
RayClusterStatus     availableWorkerReplicas:int32 conditions:[object] desiredCPU:quantity desiredGPU:quantity
                     desiredMemory:quantity desiredTPU:quantity desiredWorkerReplicas:int32 endpoints:{}
                     head:RayHeadInfo lastUpdateTime:datetime maxWorkerReplicas:int32 minWorkerReplicas:int32
                     observedGeneration:int64 readyWorkerReplicas:int32 reason state stateTransitionTimes:{datetime}
RayCluster(Object)   spec:RayClusterSpec status:RayClusterStatus

# --- Dask operator (kubernetes.dask.org/v1) ---
DaskWorker           replicas:int32 spec!:object
DaskScheduler        service!:object spec!:object
DaskClusterSpec      idleTimeout:int32 scheduler!:DaskScheduler worker!:DaskWorker
DaskClusterStatus    phase
DaskCluster(Object)  spec:DaskClusterSpec status:DaskClusterStatus
DaskWorkerGroupSpec  cluster! worker!:DaskWorker
DaskWorkerGroup(Object)  spec:DaskWorkerGroupSpec status:object
DaskAutoscalerSpec   cluster! maximum!:int32 minimum!:int32
DaskAutoscaler(Object)   spec:DaskAutoscalerSpec status:object
"""
)


@dataclass(frozen=True)
class OssResource:
    """One custom resource of an open-source operator: where it is served and what it accepts."""

    group: str
    version: str
    plural: str
    kind: str
    scale_spec_path: Optional[str]
    """``specReplicasPath`` of its ``scale`` subresource; None where the CRD has none."""
    status_subresource: bool

    @property
    def key(self) -> str:
        """How the test server names it: ``<plural>.<group>`` (Domino's plurals stay bare)."""
        return f"{self.plural}.{self.group}"

    def schema(self) -> Dict[str, Any]:
        """The ``openAPIV3Schema``: a new dict each call. The Dask operator's status is free-form."""
        schema = to_schema(TYPES, self.kind)
        if self.group == DASK_GROUP and self.kind != "DaskAutoscaler":
            schema["properties"]["status"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return schema


RAY_GROUP, DASK_GROUP = "ray.io", "kubernetes.dask.org"
OSS_RESOURCES: Dict[str, OssResource] = {
    r.key: r
    for r in (
        OssResource(RAY_GROUP, "v1", "rayclusters", "RayCluster", None, True),
        OssResource(DASK_GROUP, "v1", "daskclusters", "DaskCluster", ".spec.replicas", False),
        OssResource(DASK_GROUP, "v1", "daskworkergroups", "DaskWorkerGroup", ".spec.worker.replicas", False),
        OssResource(DASK_GROUP, "v1", "daskautoscalers", "DaskAutoscaler", None, False),
    )
}
"""Every open-source operator resource by its test-server key (``rayclusters.ray.io``...)."""

OSS_SCHEMAS: Dict[str, Dict[str, Any]] = {key: r.schema() for key, r in OSS_RESOURCES.items()}
