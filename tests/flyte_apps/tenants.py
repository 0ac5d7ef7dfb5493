"""A flow for the flyte tier's two projects sharing one connector (issue 46): one ScaleCluster node whose cluster
and size each execution gives, run by the connector under the project's rules."""
from flytekit import workflow

from flytekitplugins_ddlscale import ScaleCluster

tenant_scale = ScaleCluster("tenant_scale", cluster="dask/a-one", replicas=1, timeout=120)


@workflow
def tenant(cluster: str, replicas: int) -> None:
    tenant_scale(cluster=cluster, replicas=replicas)
