"""The other module defining a node called ``scale_down``, for another cluster."""
from flytekit import workflow

from flytekitplugins_ddlscale import ScaleCluster
from tests.flyte_apps import names_a

scale_down = ScaleCluster("scale_down", cluster="dask/names-b", replicas=0)


@workflow
def both() -> None:
    """Uses both ``scale_down`` nodes in one workflow."""
    names_a.scale_down() >> scale_down()
