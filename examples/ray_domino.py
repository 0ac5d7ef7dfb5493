"""Ray on Domino: scale the run's Ray cluster for a GPU stage, with nodes and with a phase.

Runs inside a Domino run (or Domino Flows step) with an attached Ray
cluster; the local backend runs Dask only, so this one does not run on a
laptop. Settings it relies on:

* the cluster: ``cluster="ray"`` (a bare kind) means the run's own cluster,
  ``ray-$DOMINO_RUN_ID``; give ``"ray/<name>"`` for another one;
* the backend: inside a Domino run the scaler service is chosen
  automatically (``$DOMINO_RUN_ID``; override its URL with
  ``$CLUSTER_SCALER_BASE_URL``); set ``DDLSCALE_BACKEND=kubernetes`` where
  the run's service account may patch the cluster CRDs (needed for the head
  tier change below and for holding the size against the autoscaler);
* credentials: the Domino API proxy token is used automatically
  (``$DOMINO_API_PROXY``), else ``$DOMINO_TOKEN`` / ``$DOMINO_API_KEY``;
* tiers: names as in Domino's hardware-tier list (``GPU``, ``Large``...).

Register with ``pyflyte register examples/ray_domino.py`` or run a single
stage in a Domino job with ``pyflyte run examples/ray_domino.py ray_training``.
"""
import os
from typing import List

from flytekit import kwtypes, task, workflow

from flytekitplugins_ddlscale import RestartHead, ScaleCluster, ScaleOutcome, distributed_phase, scale_down_on_failure

CLUSTER = "ray"
GPU_TIER = os.environ.get("DDLSCALE_GPU_TIER", "GPU")

scale_up = ScaleCluster("ray_scale_up", cluster=CLUSTER, replicas=8, worker_hw_tier=GPU_TIER, timeout=1800)
bigger_head = RestartHead("ray_bigger_head", cluster=CLUSTER, head_hw_tier="Large", backend="kubernetes")
scale_down = ScaleCluster("ray_scale_down", cluster=CLUSTER, replicas=1, timeout=900)
cleanup = scale_down_on_failure("ray_cleanup", cluster=CLUSTER, inputs=kwtypes(epochs=int))


def _connect_ray() -> None:
    import ray

    ray.init(address=f"ray://{os.environ['RAY_HEAD_SERVICE_HOST']}:{os.environ['RAY_HEAD_SERVICE_PORT']}")


@task
def load_shards() -> List[str]:
    """Single-node stage: list the training shards."""
    return [f"/mnt/data/shard-{i:03d}.parquet" for i in range(64)]


@task
def train(shards: List[str], epochs: int, up: ScaleOutcome) -> float:
    """Distributed stage on the GPU workers the previous node brought up."""
    import ray

    _connect_ray()

    @ray.remote(num_gpus=1)
    def epoch_loss(shard_group: List[str], epoch: int) -> float:
        return 1.0 / (epoch + 1) / len(shard_group)

    groups = [shards[i :: up.effective] for i in range(up.effective)]
    losses = [ray.get([epoch_loss.remote(g, e) for g in groups]) for e in range(epochs)]
    ray.shutdown()
    return sum(losses[-1])


@task
@distributed_phase(cluster=CLUSTER, replicas=4, worker_hw_tier=GPU_TIER, timeout=1800, reassert_interval=60)
def evaluate(loss: float) -> float:
    """A phase inside one task: at least 4 GPU workers for the body, the size it found given back after."""
    import ray

    _connect_ray()
    score = ray.get(ray.remote(lambda x: 1.0 - x).remote(loss))
    ray.shutdown()
    return score


@workflow(on_failure=cleanup)
def ray_training(epochs: int = 3) -> float:
    """Load on one node, scale to 8 GPU workers (and a larger head), train, scale down, evaluate."""
    shards = load_shards()
    up = scale_up()
    head = bigger_head()
    up >> head
    loss = train(shards=shards, epochs=epochs, up=up)
    head >> loss
    down = scale_down()
    loss >> down
    score = evaluate(loss=loss)
    down >> score
    return score
