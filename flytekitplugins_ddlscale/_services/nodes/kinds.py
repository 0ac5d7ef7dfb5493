"""One declaration per scaling node type: all that differs between the four of them.

Both task surfaces (flytekit's :mod:`...tasks`, Flyte 2's :mod:`...flyte2`)
build a node's constructor (its signature from the configuration's
fields), Flyte interface, run and summary from its :class:`NodeKind`, and
the connector service finds the configuration and inputs a template carries
by its task type here. A new node type is a configuration (:mod:`.config`),
an outcome (:mod:`.outputs`), a run (:mod:`.run`), one ``NodeKind`` line
and the connector's create for it, plus one line on each surface (a class
and its docstring in ``tasks/nodes.py``, a constructor in ``flyte2/nodes.py``).
"""
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, Generic, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union

from ..._core.progress import ProgressReporter
from ..._core.summary import restart_line, restore_line, scale_line, wait_line
from ..._core.timeline import WorkerTimeline
from .config import RestartConfig, RestoreConfig, ScaleConfig, WaitConfig
from ...refs import ClusterRef
from .names import RESTART_TASK_TYPE, RESTORE_TASK_TYPE, SCALE_TASK_TYPE, WAIT_TASK_TYPE
from .outputs import ClusterReady, RestartOutcome, RestoreOutcome, ScaleOutcome
from .run import run_restart, run_restore, run_scale, run_wait

C = TypeVar("C")
O = TypeVar("O")


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
    goal: str = "waiting for {workers}"
    """What the node's progress bar says it waits for."""
    changes_cluster: bool = True
    """Whether the node changes the cluster (a wait only reads it): an interrupt after it may leave it running."""

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

SCALE = NodeKind(
    "ScaleCluster", SCALE_TASK_TYPE, ScaleConfig, ("cluster", "replicas", "worker_hw_tier", "head_hw_tier"), ScaleOutcome,
    "Cluster scaling", scale_line, run_scale,
)
WAIT = NodeKind(
    "WaitForCluster", WAIT_TASK_TYPE, WaitConfig, ("cluster", "replicas"), ClusterReady, "Cluster wait", wait_line, run_wait,
    changes_cluster=False,
)
RESTART = NodeKind(
    "RestartHead", RESTART_TASK_TYPE, RestartConfig, ("cluster", "head_hw_tier"), RestartOutcome, "Head restart", restart_line,
    run_restart, goal="waiting for the new head",
)
RESTORE = NodeKind(
    "RestoreCluster", RESTORE_TASK_TYPE, RestoreConfig, ("cluster", "replicas", "worker_hw_tier"), RestoreOutcome, "Cluster restore",
    restore_line, run_restore,
)
NODE_KINDS: Dict[str, NodeKind] = {kind.task_type: kind for kind in (SCALE, WAIT, RESTART, RESTORE)}
"""Every node type by its task type."""
