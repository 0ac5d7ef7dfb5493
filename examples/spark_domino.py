"""Spark on Domino: pre-warm the run's Spark cluster while a single-node stage runs.

Runs inside a Domino run with an attached Spark cluster (on a laptop, run
``examples/spark_local.py`` instead). Domino configures ``spark.master`` in
runs with an attached cluster, so ``SparkSession.builder.getOrCreate()``
connects to it. Backend, credentials and tiers are chosen as described in
``examples/ray_domino.py``. Note: through the scaler service a head restart
on Spark is not possible (the service computes the wrong master pod name);
use ``backend="kubernetes"`` for ``RestartHead`` on Spark.
"""
from flytekit import kwtypes, task, workflow

from flytekitplugins_ddlscale import ClusterReady, ScaleCluster, WaitForCluster, distributed_phase, scale_down_on_failure

CLUSTER = "spark"
TIER = "Medium"

request_executors = ScaleCluster("spark_request", cluster=CLUSTER, replicas=6, worker_hw_tier=TIER, wait=False)
executors_ready = WaitForCluster("spark_ready", cluster=CLUSTER, timeout=1200)
scale_down = ScaleCluster("spark_scale_down", cluster=CLUSTER, replicas=1)
cleanup = scale_down_on_failure("spark_cleanup", cluster=CLUSTER, inputs=kwtypes(table=str))


@task
def extract(table: str) -> str:
    """Single-node stage: pull the table to a staging path."""
    return f"/mnt/staging/{table}"


@task
def aggregate(path: str, ready: ClusterReady) -> int:
    """Distributed stage on the executors that were requested before ``extract``."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("ddlscale-example").getOrCreate()
    rows = spark.read.parquet(path).groupBy("key").count().count()
    spark.stop()
    return rows


@task
@distributed_phase(cluster=CLUSTER, replicas=3, worker_hw_tier=TIER, timeout=1200)
def compact(path: str) -> str:
    """A phase: at least three executors for the body, the size it found given back after it."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("ddlscale-compact").getOrCreate()
    spark.read.parquet(path).coalesce(8).write.mode("overwrite").parquet(f"{path}-compacted")
    spark.stop()
    return f"{path}-compacted"


@workflow(on_failure=cleanup)
def spark_etl(table: str = "events") -> str:
    """Request executors, extract meanwhile, wait, aggregate, scale down, compact in a phase."""
    pending = request_executors()
    path = extract(table=table)
    pending >> path
    ready = executors_ready(replicas=pending.effective)
    path >> ready
    rows = aggregate(path=path, ready=ready)
    down = scale_down()
    rows >> down
    out = compact(path=path)
    down >> out
    return out
