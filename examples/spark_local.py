"""Spark on a laptop: a real local Spark standalone cluster, pre-warmed while a single-node stage runs.

Needs the ``spark`` extra (the README's install includes it) and Java 17+
(see docs/local.md)::

    pyflyte run examples/spark_local.py spark_flow

With nothing configured, the local backend starts a Spark master and
worker JVMs from the installed pyspark, and the flow takes them down again
at the end. The Spark code is what runs on Domino:
``SparkSession.builder.getOrCreate()`` finds the master through
``spark.master`` in the run's Spark configuration (locally,
``connected``/the phase point ``SPARK_CONF_DIR`` at the cluster's own
``spark-defaults.conf``). On Domino, set ``DDLSCALE_EXAMPLE_CLUSTER=spark``
to use the run's own cluster; ``examples/spark_domino.py`` is the
Domino-sized variant.

Shown here:

* ``ScaleCluster(wait=False)`` requests two workers while ``prepare`` runs,
  and ``WaitForCluster`` waits (for workers registered with the Spark
  master) only before the Spark stage;
* ``count_words`` runs a Spark job on those workers;
* ``check_in_phase`` runs a Spark job inside ``@distributed_phase``; the
  phase holds at least its workers and gives back what it found (the two
  workers ``request_workers`` asked for);
* ``restore`` (``RestoreCluster``) then puts back the baseline the first
  node recorded (no workers, for a cluster the flow created: it is taken
  down).
"""
import os
from typing import Dict, List

from flytekit import kwtypes, task, workflow

from flytekitplugins_ddlscale import (
    ClusterReady,
    RestoreCluster,
    ScaleCluster,
    WaitForCluster,
    connected,
    distributed_phase,
    scale_down_on_failure,
)

CLUSTER = os.environ.get("DDLSCALE_EXAMPLE_CLUSTER", "spark/spark-demo")
WORKERS = 2
TIMEOUT = 600.0

request_workers = ScaleCluster("request_workers", cluster=CLUSTER, replicas=WORKERS, wait=False, timeout=TIMEOUT)
workers_ready = WaitForCluster("workers_ready", cluster=CLUSTER, timeout=TIMEOUT)
restore = RestoreCluster("restore", cluster=CLUSTER, timeout=TIMEOUT)
cleanup = scale_down_on_failure("cleanup", cluster=CLUSTER, inputs=kwtypes(lines=int))


def _word_counts(text: List[str]) -> Dict[str, int]:
    """Count words with Spark on the cluster's executors."""
    from pyspark.sql import SparkSession

    # No console progress bar: piped, its carriage returns run into the flow's own lines.
    builder = SparkSession.builder.appName("ddlscale-spark-local").config("spark.ui.showConsoleProgress", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        words = spark.sparkContext.parallelize(text, WORKERS).flatMap(str.split)
        return dict(words.map(lambda word: (word, 1)).reduceByKey(lambda a, b: a + b).collect())
    finally:
        spark.stop()


@task
def prepare(lines: int) -> List[str]:
    """Single-node work: build the input text."""
    return [f"scale on purpose line {i % 7}" for i in range(lines)]


@task
def count_words(text: List[str], ready: ClusterReady) -> Dict[str, int]:
    """The Spark stage, on the workers requested before ``prepare``."""
    with connected(ready.cluster):
        return _word_counts(text)


@task
@distributed_phase(cluster=CLUSTER, replicas=WORKERS, timeout=TIMEOUT)
def check_in_phase(text: List[str], expected: Dict[str, int]) -> bool:
    """The same job inside a phase: the connection variables are set for the body."""
    counts = _word_counts(text)
    if counts != expected:
        raise ValueError(f"phase counts {counts} != {expected}")
    return True


@workflow(on_failure=cleanup)
def spark_flow(lines: int = 1000) -> bool:
    """Request workers, prepare meanwhile, wait, count words with Spark, check again in a phase, restore."""
    pending = request_workers()
    text = prepare(lines=lines)
    pending >> text
    ready = workers_ready(replicas=pending.effective)
    text >> ready
    counts = count_words(text=text, ready=ready)
    same = check_in_phase(text=text, expected=counts)
    same >> restore()
    return same
