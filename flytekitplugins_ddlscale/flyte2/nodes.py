"""The four scaling nodes as Flyte 2 tasks: ``ScaleCluster``, ``WaitForCluster``, ``RestartHead``, ``RestoreCluster``.

Each call defines an async task in a ``flyte.TaskEnvironment`` with the
same inputs (defaults from the definition), typed output, summary line and
page (a Report tab instead of a Deck) as the flytekit node of that name; a
parent task awaits it:

.. code-block:: python

    env = flyte.TaskEnvironment("train")
    scale_up = ScaleCluster("scale_up", env=env, cluster="dask/train", replicas=4)
    restore = RestoreCluster("restore", env=env, cluster="dask/train")

    @env.task
    async def main() -> float:
        up = await scale_up()              # a ScaleOutcome; or scale_up(replicas=8)
        loss = await train(up.effective)
        await restore()
        return loss

The node runs in its own task (a pod on a cluster, in-process in local
mode): the operation runs in a worker thread, so the event loop stays free.
Assign each node to a module variable of the node's name: a task pod finds
the task by module and name, as for ``@env.task`` functions.
"""
import asyncio
import inspect
import keyword
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Type, TypeVar, Union

from ..backends.base import DEFAULT_RESTART_TIMEOUT, DEFAULT_SCALE_TIMEOUT
from ..errors import InvalidInputError
from .._services.nodes.config import ANY_DESIRED, FROM_BASELINE, RestartConfig, RestoreConfig, ScaleConfig, WaitConfig
from .._services.nodes.outputs import ClusterReady, RestartOutcome, RestoreOutcome, ScaleOutcome
from .._services.nodes.run import run_restart, run_restore, run_scale, run_wait
from .._core.progress import Activity, WaitReporter, default_reporter, emit_summary
from ..refs import ClusterRef, parse_cluster
from .._core.summary import restart_line, restore_line, scale_line, wait_line
from .report import publish_report

if TYPE_CHECKING:
    import flyte

O = TypeVar("O")
Inputs = Dict[str, Tuple[Any, Any]]


def ScaleCluster(  # noqa: N802 - named like the flytekit node it mirrors
    name: str,
    cluster: Union[str, ClusterRef],
    replicas: int,
    worker_hw_tier: Optional[str] = None,
    head_hw_tier: Optional[str] = None,
    wait: bool = True,
    timeout: float = DEFAULT_SCALE_TIMEOUT,
    strict: bool = False,
    backend: Optional[str] = None,
    framework_ready: bool = True,
    framework_url: Optional[str] = None,
    *,
    env: "flyte.TaskEnvironment",
) -> "flyte.TaskTemplate":
    """A task that scales ``cluster``; awaiting it gives a :class:`ScaleOutcome`.

    Arguments and inputs (``cluster``, ``replicas``, ``worker_hw_tier``,
    ``head_hw_tier``) as for the flytekit ``ScaleCluster``; ``wait=False``
    returns once the request is accepted (pair it with ``WaitForCluster``).
    """
    config = ScaleConfig(
        cluster=cluster,  # type: ignore[arg-type]
        replicas=replicas,
        worker_hw_tier=worker_hw_tier,
        head_hw_tier=head_hw_tier,
        wait=wait,
        timeout=timeout,
        strict=strict,
        backend=backend,
        framework_ready=framework_ready,
        framework_url=framework_url,
    )

    def run(values: Dict[str, Any], progress: WaitReporter) -> Tuple[ScaleOutcome, Any]:
        return run_scale(config, progress=progress, **values)

    inputs: Inputs = {
        "cluster": (str, config.cluster),
        "replicas": (int, config.replicas),
        "worker_hw_tier": (Optional[str], config.worker_hw_tier),
        "head_hw_tier": (Optional[str], config.head_hw_tier),
    }
    return _node_task(env, name, inputs, ScaleOutcome, run, "Cluster scaling", scale_line, _caller_module())


def WaitForCluster(  # noqa: N802
    name: str,
    cluster: Union[str, ClusterRef],
    replicas: int = ANY_DESIRED,
    timeout: float = DEFAULT_SCALE_TIMEOUT,
    backend: Optional[str] = None,
    framework_ready: bool = True,
    framework_url: Optional[str] = None,
    *,
    env: "flyte.TaskEnvironment",
) -> "flyte.TaskTemplate":
    """A task that waits until ``cluster``'s workers are up; awaiting it gives a :class:`ClusterReady`.

    Inputs: ``cluster`` and ``replicas`` (``-1``: whatever the cluster asks for).
    """
    config = WaitConfig(
        cluster=cluster,  # type: ignore[arg-type]
        replicas=replicas,
        timeout=timeout,
        backend=backend,
        framework_ready=framework_ready,
        framework_url=framework_url,
    )

    def run(values: Dict[str, Any], progress: WaitReporter) -> Tuple[ClusterReady, Any]:
        return run_wait(config, progress=progress, **values)

    inputs: Inputs = {"cluster": (str, config.cluster), "replicas": (int, config.replicas)}
    return _node_task(env, name, inputs, ClusterReady, run, "Cluster wait", wait_line, _caller_module())


def RestartHead(  # noqa: N802
    name: str,
    cluster: Union[str, ClusterRef],
    head_hw_tier: Optional[str] = None,
    wait: bool = True,
    timeout: float = DEFAULT_RESTART_TIMEOUT,
    backend: Optional[str] = None,
    *,
    env: "flyte.TaskEnvironment",
) -> "flyte.TaskTemplate":
    """A task that replaces ``cluster``'s head (on ``head_hw_tier`` if given); awaiting it gives a :class:`RestartOutcome`."""
    config = RestartConfig(
        cluster=cluster,  # type: ignore[arg-type]
        head_hw_tier=head_hw_tier,
        wait=wait,
        timeout=timeout,
        backend=backend,
    )

    def run(values: Dict[str, Any], progress: WaitReporter) -> Tuple[RestartOutcome, Any]:
        return run_restart(config, progress=progress, **values)

    inputs: Inputs = {"cluster": (str, config.cluster), "head_hw_tier": (Optional[str], config.head_hw_tier)}
    return _node_task(
        env, name, inputs, RestartOutcome, run, "Head restart", restart_line, _caller_module(),
        goal="waiting for the new head",
    )


def RestoreCluster(  # noqa: N802
    name: str,
    cluster: Union[str, ClusterRef],
    replicas: int = FROM_BASELINE,
    worker_hw_tier: Optional[str] = None,
    wait: bool = True,
    timeout: float = DEFAULT_SCALE_TIMEOUT,
    backend: Optional[str] = None,
    framework_ready: bool = True,
    framework_url: Optional[str] = None,
    *,
    env: "flyte.TaskEnvironment",
) -> "flyte.TaskTemplate":
    """A task that puts ``cluster`` back to its recorded baseline (or ``replicas``); awaiting it gives a :class:`RestoreOutcome`."""
    config = RestoreConfig(
        cluster=cluster,  # type: ignore[arg-type]
        replicas=replicas,
        worker_hw_tier=worker_hw_tier,
        wait=wait,
        timeout=timeout,
        backend=backend,
        framework_ready=framework_ready,
        framework_url=framework_url,
    )

    def run(values: Dict[str, Any], progress: WaitReporter) -> Tuple[RestoreOutcome, Any]:
        return run_restore(config, progress=progress, **values)

    inputs: Inputs = {
        "cluster": (str, config.cluster),
        "replicas": (int, config.replicas),
        "worker_hw_tier": (Optional[str], config.worker_hw_tier),
    }
    return _node_task(env, name, inputs, RestoreOutcome, run, "Cluster restore", restore_line, _caller_module())


def _caller_module() -> str:
    """The module that called the node's constructor (two frames up): the task lives there."""
    return str(sys._getframe(2).f_globals.get("__name__", "__main__"))


def _node_task(
    env: "flyte.TaskEnvironment",
    name: str,
    inputs: Inputs,
    output: Type[O],
    run: Callable[[Dict[str, Any], WaitReporter], Tuple[O, Any]],
    title: str,
    summary: Callable[[str, O, float], str],
    module: str,
    goal: str = "waiting for {workers}",
) -> "flyte.TaskTemplate":
    """An async function with ``inputs`` and ``output`` as its typed signature, made a task of ``env``."""
    import flyte

    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise InvalidInputError("name", name, "a Python identifier: the module variable the node is assigned to")
    if not isinstance(env, flyte.TaskEnvironment):
        raise InvalidInputError("env", type(env).__name__, "the flyte.TaskEnvironment the node's task belongs to")

    def execute(values: Dict[str, Any]) -> O:
        started = time.monotonic()
        activity = Activity(name, str(parse_cluster(values["cluster"])), goal)
        with default_reporter(activity) as progress:
            outcome, timeline = run(values, progress)
        publish_report(f"{title}: {env.name}.{name}", timeline, vars(outcome))
        emit_summary(summary(name, outcome, time.monotonic() - started))
        return outcome

    async def node(**values: Any) -> O:
        given = {key: default for key, (_, default) in inputs.items()}
        given.update(values)
        return await asyncio.to_thread(execute, given)

    node.__name__ = node.__qualname__ = name
    node.__module__ = module
    node.__doc__ = f"{title} ({output.__name__}), a ddlscale node."
    node.__annotations__ = {**{key: kind for key, (kind, _) in inputs.items()}, "return": output}
    node.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
         for key, (kind, default) in inputs.items()],
        return_annotation=output,
    )
    return env.task(cache="disable", report=True)(node)
