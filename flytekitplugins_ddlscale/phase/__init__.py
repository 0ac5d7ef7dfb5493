"""``@distributed_phase``: hold a cluster at a size for the length of a function.

.. code-block:: python

    @task(enable_deck=True)
    @distributed_phase(cluster="dask/train", replicas=4, worker_hw_tier="Medium")
    def train(path: str) -> float:
        client = Client(f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:"
                        f"{os.environ['DASK_SCHEDULER_SERVICE_PORT']}")
        ...

Before the body the cluster is claimed, scaled to the largest live claim and its workers awaited (and
registered with the framework where the run can reach the head); after it, on return, exception or
SIGTERM/SIGINT, the claim is released and the cluster shrunk to the largest remaining claim or restored. In a
task pod the backend being unavailable for now fails the task as recoverable (:mod:`.._services.recoverable`).
Placed above ``@task`` it raises ``TypeError`` showing the right order. The phase itself is :mod:`..hold`.
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
    """Decorate a function (under ``@task``) so it runs with ``cluster`` (``kind/name``,
    ``namespace/kind/name``, a bare kind or a ClusterRef) holding at least ``replicas`` workers.

    ``options``: :class:`PhaseOptions` as keywords (tiers, ``restore``, ``timeout``, ``backend``, framework
    readiness, intervals, ``lease_seconds``, ``fail_on_fault``); ``deck`` attaches a Deck of the worker count
    over time and worker-seconds by tier. Arguments are checked when the decorator is applied.
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
