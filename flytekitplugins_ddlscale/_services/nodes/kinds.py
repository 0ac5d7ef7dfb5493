"""What a scaling node type is: one :class:`NodeKind` declares all that differs between node types.

Both task surfaces (flytekit's :mod:`...tasks`, Flyte 2's :mod:`...flyte2`)
build a node's constructor (its signature from the configuration's
fields), Flyte interface, run and summary from its kind, and the connector
service (:mod:`..connector_core`) its create and polls. Each node type is
one module declaring its kind (:mod:`.scale`, :mod:`.wait`,
:mod:`.restart`, :mod:`.restore`), listed once in :mod:`.registry`; a new
node type is that module, its line in the registry, and a line on each
surface (a class and its docstring in ``tasks/nodes.py``, a constructor in
``flyte2/nodes.py``).
"""
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, Generic, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union

from ...errors import ScalingError
from ...models import ClusterState
from ..._core.progress import ProgressReporter
from ..._core.timeline import WorkerTimeline
from ..readiness import Readiness
from ...refs import ClusterRef
from .creating import Creation, Sent

C = TypeVar("C")
O = TypeVar("O")


def _as_created(target: int, state: ClusterState) -> int:
    return target


def _as_raised(backend: Any, ref: ClusterRef, error: ScalingError, target: int) -> ScalingError:
    return error


@dataclass(frozen=True)
class NodeKind(Generic[C, O]):
    """A scaling node type: its task type, configuration, run-time inputs, outcome, run and wording."""

    node: str
    """The node type's name on both surfaces, e.g. ``ScaleCluster``."""
    task_type: str
    config: Type[C]
    inputs: Tuple[str, ...]
    """The configuration fields a flow may also pass when it runs the node (defaults: the configuration's)."""
    output: Type[O]
    title: str
    """The title of the node's Deck or Report tab."""
    summary: Callable[[str, O, Optional[float]], str]
    """The node's one summary line from (node name, outcome, seconds)."""
    run: Callable[..., Tuple[O, WorkerTimeline]]
    """What the node does: ``run(config, progress=..., **inputs)`` gives the outcome and its timeline."""
    create: Callable[[Creation, C, Dict[str, Any]], Sent]
    """What a connector's ``create`` does: ``create(creation, config, inputs)`` checks the node, sends its
    change without waiting (within the creation's bound) and says what the polls wait for."""
    finish: Callable[[Any, ClusterState, float, Readiness], O]
    """A connector poll's outcome once the goal is reached: ``finish(metadata, state, seconds, readiness)``
    completes the outcome ``create`` knew (``metadata.outcome_of(...)``)."""
    goal: str = "waiting for {workers}"
    """What the node's progress bar says it waits for."""
    changes_cluster: bool = True
    """Whether the node changes the cluster (a wait only reads it): an interrupt after it may leave it running."""
    cached: str = ""
    """What a cached run of the node would do wrong: why a Flyte cache (``cache=True``) is refused for it."""
    awaited: Callable[[int, ClusterState], int] = _as_created
    """The workers a connector poll waits for, from the ``target`` create set and the state read."""
    failed: Callable[[Any, ClusterRef, ScalingError, int], ScalingError] = _as_raised
    """A connector poll's error when the node fails waiting for ``target`` workers (a size change's says
    what it left in place and how to undo it)."""
    change: str = "the change"
    """What a connector's ``create`` sends, in its messages (``the scale``)."""
    repeatable: bool = True
    """Whether what ``create`` sends is safe to send again (it sets a size or reads a state): a create
    that meets a backend outage then leaves the send to the polls instead of failing the node."""

    def interface(self, config: C) -> Dict[str, Tuple[Any, Any]]:
        """The node's Flyte inputs: each input's type (from the configuration) and its default (the configured value)."""
        types = typing.get_type_hints(self.config)
        return {name: (types[name], getattr(config, name)) for name in self.inputs}

    def given(self, config: C, values: Mapping[str, Any]) -> Dict[str, Any]:
        """The inputs of one run: those ``values`` gives, the configured ones for the rest."""
        return {name: values.get(name, getattr(config, name)) for name in self.inputs}

    def configure(
        self, args: Sequence[Any], options: Mapping[str, Any], surface_options: Collection[str] = ()
    ) -> Tuple[C, Dict[str, Any]]:
        """The configuration a constructor's arguments after the node's name give, and the surface's options.

        ``args`` fill the configuration's fields in their order, as do the
        keywords named like a field; keywords named in ``surface_options``
        (flytekit's task options) come back untouched. Any other keyword, a
        missing or a doubled field raises TypeError naming it (and, for a
        keyword, what is allowed), as a Python call would; a bad value, the
        field's own :class:`InvalidInputError`.
        """
        fields = inspect.signature(self.config)
        given = {name: options[name] for name in fields.parameters if name in options}
        rest = {key: value for key, value in options.items() if key not in given}
        unknown = sorted(set(rest) - set(surface_options))
        if unknown:
            allowed = f"the configuration's fields ({', '.join(fields.parameters)})"
            if surface_options:
                allowed += f" and the task options ({', '.join(sorted(surface_options))})"
            raise TypeError(f"{self.node}: unexpected keyword argument {unknown[0]!r}; allowed: {allowed}")
        try:
            bound = fields.bind(*args, **given)
        except TypeError as error:
            raise TypeError(f"{self.node}: {error}") from None
        return self.config(*bound.args, **bound.kwargs), rest

    def signature(self, trailing: inspect.Parameter) -> inspect.Signature:
        """A constructor's signature: ``name``, the configuration's fields (``cluster`` also as a
        :class:`ClusterRef`), then the surface's ``trailing`` parameter; what ``help()`` and notebooks show."""
        fields = [
            parameter.replace(annotation=Union[str, ClusterRef]) if parameter.name == "cluster" else parameter
            for parameter in inspect.signature(self.config).parameters.values()
        ]
        return inspect.Signature([_NAME, *fields, trailing])

    def perform(self, config: C, values: Mapping[str, Any], progress: ProgressReporter) -> Tuple[O, WorkerTimeline]:
        """Run the node once with ``values`` as its inputs."""
        return self.run(config, progress=progress, **self.given(config, values))


_NAME = inspect.Parameter("name", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)
"""Every node's first parameter: its name."""
