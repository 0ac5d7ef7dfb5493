"""How each kind of cluster is laid out on Kubernetes: its custom resource, pod labels and pod names, as
the Kubernetes backend patches them, the scaler service answers with them and local processes are named.
"""
from dataclasses import dataclass
from typing import Dict, Optional

from ...refs import KINDS, ClusterRef

CRD_GROUP = "distributed-compute.dominodatalab.com"
"""API group of Domino's distributed-compute operator (DCO)."""
CRD_VERSION = "v1alpha1"

LABEL_APP = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_OPERATOR = "distributed-compute-operator"
LABEL_OWNER = "dominodatalab.com/starting-user-id"
LABEL_HW_TIER = "dominodatalab.com/hardware-tier-id"
NODE_POOL_SELECTOR = "dominodatalab.com/node-pool"


@dataclass(frozen=True)
class CrdLayout:
    """How one kind's clusters are laid out on Kubernetes."""

    kind: str
    """The short kind (a key of :data:`~flytekitplugins_ddlscale.refs.KINDS`)."""
    crd_kind: str
    """The custom resource's ``kind``: ``RayCluster``."""
    app: str
    """Value of the ``app.kubernetes.io/name`` label on the cluster's pods."""
    head_section: Optional[str]
    """Spec key of the head section (``head``, ``master``, ``scheduler``, ``headGroupSpec``); None for MPI."""
    head_component: Optional[str]
    """``app.kubernetes.io/component`` of the head pod; None for MPI."""
    group: str = CRD_GROUP
    """API group of the custom resource: Domino's DCO, ``ray.io`` (KubeRay) or ``kubernetes.dask.org``."""
    version: str = CRD_VERSION
    flavour: str = "dco"
    """Which operator manages it: ``dco``, ``kuberay`` or ``daskop``; the Kubernetes backend picks its
    resource adapter by this."""

    @property
    def plural(self) -> str:
        """The custom resource's plural, as in REST paths: ``rayclusters``."""
        return KINDS[self.kind].plural

    @property
    def autoscaling(self) -> bool:
        """Whether the custom resource takes ``spec.autoscaling``."""
        return KINDS[self.kind].autoscaling

    def head_pod_name(self, cluster: str) -> Optional[str]:
        """The operator's head pod name for ``cluster`` (StatefulSet ordinal 0); None without a head."""
        if self.head_component is None:
            return None
        return f"{cluster}-{self.app}-{self.head_component}-0"

    def worker_pod_prefix(self, cluster: str) -> str:
        """Prefix shared by the worker pods of ``cluster``: ``<name>-<app>-worker-``."""
        return f"{cluster}-{self.app}-worker-"


LAYOUTS: Dict[str, CrdLayout] = {
    "ray": CrdLayout("ray", "RayCluster", "ray", "head", "head"),
    "spark": CrdLayout("spark", "SparkCluster", "spark", "master", "master"),
    "dask": CrdLayout("dask", "DaskCluster", "dask", "scheduler", "scheduler"),
    "mpi": CrdLayout("mpi", "MPICluster", "mpi", None, None),
    "kuberay": CrdLayout("kuberay", "RayCluster", "kuberay", "headGroupSpec", "head", "ray.io", "v1", "kuberay"),
    "dask-operator": CrdLayout(
        "dask-operator", "DaskCluster", "dask", "scheduler", "scheduler", "kubernetes.dask.org", "v1", "daskop"
    ),
}
"""The layout of every kind on Kubernetes: the kinds the Kubernetes backend serves. A kind served only
off Kubernetes (a backend of its own) needs none."""


def layout_of(ref: ClusterRef) -> CrdLayout:
    """The Kubernetes layout of ``ref``'s kind."""
    return LAYOUTS[ref.kind]
