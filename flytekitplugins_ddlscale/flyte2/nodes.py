"""The four scaling nodes as Flyte 2 tasks: ``ScaleCluster``, ``WaitForCluster``, ``RestartHead``, ``RestoreCluster``.

Each call defines a task in a ``flyte.TaskEnvironment`` with the inputs, typed output and summary line of the
flytekit node of that name (a Report tab instead of a Deck); a parent task awaits it:

.. code-block:: python

    env = flyte.TaskEnvironment("train")
    scale_up = ScaleCluster("scale_up", env=env, cluster="dask/train", replicas=4)

    @env.task
    async def main() -> float:
        up = await scale_up()              # a ScaleOutcome; or scale_up(replicas=8)
        return await train(up.effective)

Each node is a connector task (:class:`.node_task.ScalingNodeTask`) in an environment of its own that ``env``
depends on: no pod starts. Name each node like the module variable it is assigned to.
"""
import inspect
import keyword
from typing import TYPE_CHECKING, Any, Callable

from ..errors import InvalidInputError
from .._services.nodes.interrupted import report_left_running
from .._services.nodes.kinds import NodeKind
from .._services.nodes.names import OUTPUT_NAME
from .._services.nodes.restart import RESTART, RestartOutcome
from .._services.nodes.restore import RESTORE, RestoreOutcome
from .._services.nodes.scale import SCALE, ScaleOutcome
from .._services.nodes.wait import WAIT, ClusterReady
from .._services.hold.signals import RELAY

if TYPE_CHECKING:
    import flyte

__all__ = [
    "ScaleCluster", "ScaleOutcome", "WaitForCluster", "ClusterReady", "RestartHead", "RestartOutcome",
    "RestoreCluster", "RestoreOutcome",
]

_ENV = inspect.Parameter("env", inspect.Parameter.KEYWORD_ONLY, annotation="flyte.TaskEnvironment")


def _constructor(kind: NodeKind, doc: str) -> Callable[..., "flyte.TaskTemplate"]:
    """The Flyte 2 constructor of ``kind``: ``(name, <its configuration's fields>, *, env)``."""

    def define(name: str, *fields: Any, env: "flyte.TaskEnvironment", **options: Any) -> "flyte.TaskTemplate":
        config, _ = kind.configure(fields, options)
        return _node_task(env, name, kind, config)

    define.__name__ = define.__qualname__ = kind.node
    define.__doc__ = doc
    define.__signature__ = kind.signature(_ENV)  # type: ignore[attr-defined]
    return define


ScaleCluster = _constructor(SCALE, """A task that scales ``cluster``; awaiting it gives a :class:`ScaleOutcome`.

Arguments and inputs (``cluster``, ``replicas``, ``worker_hw_tier``,
``head_hw_tier``) as for the flytekit ``ScaleCluster``; ``wait=False``
returns once the request is accepted (pair it with ``WaitForCluster``).
""")
WaitForCluster = _constructor(WAIT, """A task that waits until ``cluster``'s workers are up; awaiting it gives a :class:`ClusterReady`.

Inputs: ``cluster`` and ``replicas`` (``-1``: whatever the cluster asks for).
""")
RestartHead = _constructor(RESTART, """A task that replaces ``cluster``'s head (on ``head_hw_tier`` if given); awaiting it gives a :class:`RestartOutcome`.""")
RestoreCluster = _constructor(RESTORE, """A task that puts ``cluster`` back to its recorded baseline (or ``replicas``); awaiting it gives a :class:`RestoreOutcome`.""")


def _node_task(env: "flyte.TaskEnvironment", name: str, kind: NodeKind, config: Any) -> "flyte.TaskTemplate":
    """The node of ``kind`` as a connector task named ``<env>.<name>``, in its own environment
    (:func:`node_environment_name`) that ``env`` depends on; installs, from the main thread that defines it,
    the signal relay's report of the clusters an interrupted local run leaves running."""
    import flyte
    from flyte.models import NativeInterface

    from .node_task import ScalingNodeTask

    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise InvalidInputError("name", name, "a Python identifier: the module variable the node is assigned to")
    if not isinstance(env, flyte.TaskEnvironment):
        raise InvalidInputError("env", type(env).__name__, "the flyte.TaskEnvironment the node's task belongs to")
    node = ScalingNodeTask(
        name=f"{env.name}.{name}",
        short_name=name,
        task_type=kind.task_type,
        interface=NativeInterface(inputs=kind.interface(config), outputs={OUTPUT_NAME: kind.output}),
        image=None,
        # On a cluster the connector runs the node and no Report is written; a local run saves its own.
        report=False,
        docs=None,
        node_config=config,
        kind=kind,
    )
    # As flyte's own connector tasks join a flow: an environment of their own that the flow's depends on,
    # so deploying `env` deploys the node too.
    env.add_dependency(flyte.TaskEnvironment.from_task(node_environment_name(env.name, name), node))
    RELAY.install()
    RELAY.after_phases(_report_left_running)
    return node


def node_environment_name(env_name: str, name: str) -> str:
    """The name of the environment holding node ``name`` of ``env_name``: both joined with ``-``, in the
    lower-case snake or kebab case flyte requires (``train`` and ``scale_up``: ``train-scale_up``)."""
    words = [word for word in name.lower().split("_") if word]
    return f"{env_name}-{'_'.join(words) or 'node'}"


def _report_left_running(signum: int) -> None:
    """The relay's callback: what the interrupted local run left running (nothing when all is stopped)."""
    report_left_running()
