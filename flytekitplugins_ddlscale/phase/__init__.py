"""``@distributed_phase``: hold a cluster at a size for the length of a function.

.. code-block:: python

    @task(enable_deck=True)
    @distributed_phase(cluster="dask/train", replicas=4, worker_hw_tier="Medium")
    def train(path: str) -> float:
        client = Client(f"tcp://{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:"
                        f"{os.environ['DASK_SCHEDULER_SERVICE_PORT']}")
        ...

Before the body: baseline recorded, claim registered, cluster scaled to the
largest live claim and workers awaited (and, where the run can reach the
cluster's head, registered with the framework). After it, on return, exception
or SIGTERM/SIGINT: claim released and the cluster shrunk to the largest
remaining claim, or restored to the baseline (or the ``restore`` spec) when
none remain. ``functools.wraps`` keeps the signature, so ``@task`` above it
sees the body's typed interface; placed above ``@task`` it raises
``TypeError`` showing the right order. The phase itself (claims, scaling,
signals, the monitor) is :mod:`..hold`, shared with ``ddlscale run``.
"""
import functools
from typing import Any, Callable, Optional, TypeVar, cast

from ..backends.base import DEFAULT_SCALE_TIMEOUT
from .._services.hold import ClusterPhase, PhaseInterrupted, cluster_phase
from .._services.hold.settings import (
    DEFAULT_REASSERT_INTERVAL,
    DEFAULT_SAMPLE_INTERVAL,
    RESTORE_BASELINE,
    PhaseSettings,
    Restore,
)
from .._core.leases import DEFAULT_LEASE_SECONDS
from ..refs import ClusterSpec

F = TypeVar("F", bound=Callable[..., Any])


def distributed_phase(
    cluster: ClusterSpec,
    replicas: int,
    worker_hw_tier: Optional[str] = None,
    head_hw_tier: Optional[str] = None,
    restore: Restore = RESTORE_BASELINE,
    timeout: float = DEFAULT_SCALE_TIMEOUT,
    backend: Optional[str] = None,
    *,
    framework_ready: bool = True,
    framework_url: Optional[str] = None,
    reassert_interval: Optional[float] = DEFAULT_REASSERT_INTERVAL,
    sample_interval: float = DEFAULT_SAMPLE_INTERVAL,
    deck: bool = True,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    fail_on_fault: bool = False,
) -> Callable[[F], F]:
    """Decorate a function (under ``@task``) so it runs with the cluster scaled for it.

    ``cluster``: ``kind/name``, ``namespace/kind/name``, a bare kind (the
    run's own cluster) or a ClusterRef. ``replicas``: at least this many
    workers (a cluster found larger on the same tier is not shrunk).
    ``restore``: ``"baseline"`` (the default: when the last live phase ends,
    the size the cluster had outside phases comes back) or a
    :class:`ReplicaSpec`. ``timeout`` bounds the scale-up, the readiness
    checks and the restore. ``framework_ready`` also waits until workers are
    registered with Dask/Ray/Spark where the run can reach the cluster's head
    (over its HTTP status endpoint; ``framework_url`` overrides where the head
    is, see docs/readiness.md).
    ``reassert_interval`` (seconds, None to disable) applies where the
    backend cannot hold the size against the autoscaler. ``deck`` attaches a
    Deck with worker count over time and worker-seconds by tier.
    ``lease_seconds``: how long the phase's claim outlives its last renewal
    (renewed every third of it while the phase runs; see docs/flyte.md).
    ``fail_on_fault``: when the cluster loses its head or workers during the
    body, stop the body and raise :class:`ClusterFaultError` instead of
    repairing it (where the backend can) and reporting it in the summary and
    Deck.

    Arguments are checked when the decorator is applied; the cluster name
    itself is resolved when the function is called.
    """
    options = dict(
        worker_hw_tier=worker_hw_tier,
        head_hw_tier=head_hw_tier,
        restore=restore,
        timeout=timeout,
        backend=backend,
        framework_ready=framework_ready,
        framework_url=framework_url,
        reassert_interval=reassert_interval,
        sample_interval=sample_interval,
        deck=deck,
        lease_seconds=lease_seconds,
        fail_on_fault=fail_on_fault,
    )
    PhaseSettings(cluster=cluster, replicas=replicas, **options)  # type: ignore[arg-type]

    def decorate(fn: F) -> F:
        _refuse_task_object(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with cluster_phase(cluster, replicas, label=fn.__name__, **options):  # type: ignore[arg-type]
                return fn(*args, **kwargs)

        return cast(F, wrapper)

    return decorate


def _refuse_task_object(fn: object) -> None:
    from flytekit.core.base_task import PythonTask

    if not isinstance(fn, PythonTask):
        return
    short = fn.name.rsplit(".", 1)[-1]
    raise TypeError(
        f"@distributed_phase was applied to the Flyte task {fn.name!r}; it must wrap the function, "
        "so put it below @task:\n\n"
        "    @task\n"
        "    @distributed_phase(cluster=..., replicas=...)\n"
        f"    def {short}(...): ..."
    )


__all__ = ["ClusterPhase", "PhaseInterrupted", "cluster_phase", "distributed_phase"]
