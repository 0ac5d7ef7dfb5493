"""``@distributed_phase``: hold a cluster at a size for the length of a function.

.. code-block:: python

    @task(enable_deck=True)
    @distributed_phase(cluster="dask/train", replicas=4, worker_hw_tier="Medium")
    def train(path: str) -> float:
        client = Client(f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:"
                        f"{os.environ['DASK_SCHEDULER_SERVICE_PORT']}")
        ...

Before the body: baseline recorded, claim registered, cluster scaled to the
largest live claim and workers awaited (and, where the run can reach the
cluster's head, registered with the framework). After it, on return, exception
or SIGTERM/SIGINT: claim released and the cluster shrunk to the largest
remaining claim, or restored to the baseline (or the ``restore`` spec) when
none remain. In a task pod, the backend being unavailable for now (the
transient family, :mod:`.._services.recoverable`) fails the task as
recoverable, so Flyte applies its ``retries``; other failures stay
non-recoverable. ``functools.wraps`` keeps the signature, so ``@task`` above
it sees the body's typed interface; placed above ``@task`` it raises
``TypeError`` showing the right order. The phase itself (claims, scaling,
signals, the monitor) is :mod:`..hold`, shared with ``ddlscale run``.
"""
import functools
from typing import Any, Callable, TypeVar, cast

from typing_extensions import Unpack

from .._services.hold import ClusterPhase, PhaseInterrupted, cluster_phase, misplaced_phase
from .._services.hold.settings import PhaseOptions, PhaseSettings
from ..refs import ClusterSpec

F = TypeVar("F", bound=Callable[..., Any])


def distributed_phase(
    cluster: ClusterSpec, replicas: int, *, deck: bool = True, **options: Unpack[PhaseOptions]
) -> Callable[[F], F]:
    """Decorate a function (under ``@task``) so it runs with the cluster scaled for it.

    ``cluster``: ``kind/name``, ``namespace/kind/name``, a bare kind (the
    run's own cluster) or a ClusterRef. ``replicas``: at least this many
    workers (a cluster found larger on the same tier is not shrunk).
    ``options``: :class:`PhaseOptions` as keywords (tiers, ``restore``,
    ``timeout``, ``backend``, framework readiness, intervals,
    ``lease_seconds``, ``fail_on_fault``). ``deck`` attaches a Deck with
    worker count over time and worker-seconds by tier.

    Arguments are checked when the decorator is applied; the cluster name
    itself is resolved when the function is called.
    """
    settings = PhaseSettings(cluster, replicas, deck=deck, **options)  # type: ignore[arg-type]

    def decorate(fn: F) -> F:
        _refuse_task_object(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from .._services.recoverable import recoverable_in_pod

            with recoverable_in_pod(), ClusterPhase(settings, fn.__name__):
                return fn(*args, **kwargs)

        return cast(F, wrapper)

    return decorate


def _refuse_task_object(fn: object) -> None:
    from flytekit.core.base_task import PythonTask

    if isinstance(fn, PythonTask):
        raise misplaced_phase(fn.name, "Flyte", "@task")


__all__ = ["ClusterPhase", "PhaseInterrupted", "PhaseOptions", "cluster_phase", "distributed_phase"]
