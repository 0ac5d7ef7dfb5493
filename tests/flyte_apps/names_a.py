"""One of two modules that both define a node called ``scale_down`` (task names are global in Flyte)."""
from flytekitplugins_ddlscale import ScaleCluster

scale_down = ScaleCluster("scale_down", cluster="dask/names-a", replicas=0)
