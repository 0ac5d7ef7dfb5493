"""Scale a shared Dask-operator (or KubeRay) cluster for one stage of a Flyte flow, then restore it.

For the Flyte sandbox walkthrough in docs/sandbox.md. The cluster lives
beside Flyte, created from ``examples/k8s/dask-operator-cluster.yaml`` (or
``kuberay-cluster.yaml``); the task pods' service account is bound to the
Role in ``examples/k8s/dask-operator-rbac.yaml`` (or ``kuberay-rbac.yaml``).
Settings it relies on:

* the cluster: ``$DDLSCALE_EXAMPLE_CLUSTER`` at registration, default
  ``dask-clusters/dask-operator/shared-dask`` (``ray-clusters/kuberay/shared-ray``
  for KubeRay; ``@<group>`` chooses a worker group);
* the backend: ``kubernetes`` (explicit below), with the pod's in-cluster
  service account;
* the stage connects through the scheduler service the Dask operator created
  (``<name>-scheduler.<namespace>.svc:8786``), which the backend's
  ``connection_env`` names.

Run it on the sandbox with ``pyflyte run --remote --image <image> examples/k8s_operator_flow.py
operator_flow --n 200000``.
"""
import os

from flytekit import task, workflow

from flytekitplugins_ddlscale import RestoreCluster, ScaleCluster, ScaleOutcome
from flytekitplugins_ddlscale.backends import get_backend
from flytekitplugins_ddlscale.refs import parse_cluster

CLUSTER = os.environ.get("DDLSCALE_EXAMPLE_CLUSTER", "dask-clusters/dask-operator/shared-dask")

scale_up = ScaleCluster("operator_scale_up", cluster=CLUSTER, replicas=4, timeout=900, backend="kubernetes")
restore = RestoreCluster("operator_restore", cluster=CLUSTER, timeout=900, backend="kubernetes")


@task
def sum_of_squares(n: int, up: ScaleOutcome) -> int:
    """The distributed stage: runs on the workers ``up`` brought up (Dask operator clusters)."""
    from distributed import Client

    # ``up.cluster`` is the cluster the node scaled, as registered (the module's default may differ here).
    with get_backend("kubernetes") as backend:
        env = backend.connection_env(parse_cluster(up.cluster))
    address = f"{env['DASK_SCHEDULER_SERVICE_HOST']}:{env['DASK_SCHEDULER_SERVICE_PORT']}"
    with Client(address) as client:
        chunks = [range(i, min(i + 10_000, n)) for i in range(0, n, 10_000)]
        futures = client.map(lambda r: sum(x * x for x in r), chunks)
        return sum(client.gather(futures))


@workflow
def operator_flow(n: int = 200_000) -> int:
    """Scale up, compute on the workers, restore the recorded baseline."""
    up = scale_up()
    total = sum_of_squares(n=n, up=up)
    done = restore()
    total >> done
    return total
