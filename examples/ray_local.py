"""Ray, runnable on a laptop: a flow with scaling nodes and a phase (the README's phase snippet is from here).

    pyflyte run examples/ray_local.py train_flow

With nothing configured, the local backend starts a real local Ray cluster
(``ray start`` head and worker nodes; needs the ``ray`` extra, which the
README's install includes): ``scale_up`` waits until 2 worker nodes
are ALIVE on the head, ``train`` runs Ray tasks on them through a ``ray://``
client built from ``RAY_HEAD_SERVICE_HOST``/``_PORT`` as on Domino,
``scale_down`` leaves the head without workers, and ``evaluate`` holds one
worker for its body; when it ends the cluster goes back to the size it
found (no workers: for a cluster the flow created that takes it down), so
the run leaves no process behind.

On Domino, use ``cluster="ray"`` (the run's own cluster) and Domino's tier
names; ``connected`` then leaves Domino's own variables alone.
"""
import os

from flytekit import task, workflow
from flytekitplugins_ddlscale import ScaleCluster, ScaleOutcome, connected, distributed_phase

scale_up = ScaleCluster("scale_up", cluster="ray/demo", replicas=2, worker_hw_tier="Medium")
scale_down = ScaleCluster("scale_down", cluster="ray/demo", replicas=0)


def ray_connect() -> None:
    import ray  # what Domino documents for code in a run with a Ray cluster

    address = f"ray://{os.environ['RAY_HEAD_SERVICE_HOST']}:{os.environ['RAY_HEAD_SERVICE_PORT']}"
    ray.init(address, logging_level="ERROR")  # Ray's INFO chatter would bury the flow's own lines


@task
def train(up: ScaleOutcome) -> float:     # runs once 2 workers joined the Ray head
    with connected(up.cluster):           # RAY_HEAD_SERVICE_HOST/_PORT, as Domino sets them
        import ray                        # after them: Ray reads RAY_AUTH_MODE on import

        ray_connect()
        losses = ray.get([ray.remote(lambda s: 1.0 / (s + 1)).remote(s) for s in range(8)])
        ray.shutdown()
    return sum(losses)


@task
@distributed_phase(cluster="ray/demo", replicas=1)
def evaluate(loss: float) -> float:       # scaled before the body, restored after it,
    import ray                            # on return, exception, SIGTERM or timeout

    ray_connect()
    score = ray.get(ray.remote(lambda x: 1.0 / x).remote(loss))
    ray.shutdown()
    return score


@workflow
def train_flow() -> float:
    up = scale_up()                       # typed output: requested, effective, ready_workers, ...
    loss = train(up=up)
    down = scale_down()
    loss >> down
    score = evaluate(loss=loss)
    down >> score
    return score
