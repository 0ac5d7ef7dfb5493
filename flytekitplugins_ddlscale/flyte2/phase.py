"""``distributed_phase`` for Flyte 2 task functions, sync and async, under ``@env.task``: flytekit's
:class:`..hold.ClusterPhase`, with the process's signal relay installed (Flyte 2 runs bodies outside the main
thread), an async body's start and restore run to their end even when cancelled, and a Report tab.
"""
import asyncio
import functools
import inspect
from typing import Any, Callable, Optional, TypeVar, cast

from typing_extensions import Unpack

from .._services.hold import ClusterPhase, misplaced_phase
from .._services.hold.settings import PhaseOptions, PhaseSettings
from .._services.hold.signals import RELAY
from ..refs import ClusterSpec
from .report import publish_report

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def distributed_phase(
    cluster: ClusterSpec, replicas: int, *, report: bool = True, **options: Unpack[PhaseOptions]
) -> Callable[[F], F]:
    """Decorate a Flyte 2 task function (below ``@env.task``) so it runs with the cluster scaled for it:
    arguments as for the flytekit ``distributed_phase``, checked when the decorator is applied; ``report``
    adds the phase's tab (Timeline rows, worker plot, worker-seconds by tier) to the task's Report.
    """
    settings = PhaseSettings(cluster, replicas, deck=report, **options)  # type: ignore[arg-type]
    RELAY.install()

    def decorate(fn: F) -> F:
        _refuse_task_object(fn)
        label = fn.__name__
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                phase = ClusterPhase(settings, label, publish=publish_report)
                try:
                    await _to_the_end(phase.__enter__)
                    result = await fn(*args, **kwargs)
                except BaseException as exc:
                    # After a failed start the phase has already given back: this exit does nothing then.
                    await _to_the_end(phase.__exit__, type(exc), exc, exc.__traceback__)
                    raise
                await _to_the_end(phase.__exit__, None, None, None)
                return result

            return cast(F, run_async)

        @functools.wraps(fn)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            with ClusterPhase(settings, label, publish=publish_report):
                return fn(*args, **kwargs)

        return cast(F, run_sync)

    return decorate


async def _to_the_end(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` in a worker thread, awaited to its end: a cancellation that arrives meanwhile is raised
    once it has ended, so a phase's start or restore is never left half-way."""
    job = asyncio.ensure_future(asyncio.to_thread(call, *args))
    cancelled: Optional[asyncio.CancelledError] = None
    while True:
        try:
            result = await asyncio.shield(job)
            break
        except asyncio.CancelledError as exc:
            if job.done():
                raise
            cancelled = exc
    if cancelled is not None:
        raise cancelled
    return result


def _refuse_task_object(fn: object) -> None:
    import flyte

    if isinstance(fn, flyte.TaskTemplate):
        raise misplaced_phase(fn.name, "Flyte 2", "@env.task(report=True)")
