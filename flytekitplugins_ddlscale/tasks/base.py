"""The shared shape of the scaling task types: a Python task with no user function.

They are :class:`~flytekit.core.python_function_task.PythonInstanceTask`
subclasses, so in a container flytekit's default task resolver finds the
instance by module and variable name (like ``ShellTask``) and runs
:meth:`execute` there; the configuration also travels in the template's
``custom`` for the Flyte connector.

Task names are global in Flyte, so a name given without a dot is
qualified by the defining module, as flytekit does for function tasks:
``ScaleCluster("scale_down", ...)`` in ``flows.train`` is the task
``flows.train.scale_down``.
"""
from typing import Any, Dict, Generic, Tuple, Type, TypeVar

from flytekit.configuration import SerializationSettings
from flytekit.deck import DeckField
from flytekit.core.interface import Interface
from flytekit.core.python_function_task import PythonInstanceTask

from .._core.deck import publish_deck, render_html
from .._services.nodes.names import OUTPUT_NAME, qualified_name
from .._core.progress import Activity, WaitReporter, default_reporter
from ..refs import parse_cluster
from .._core.timeline import WorkerTimeline

C = TypeVar("C")

DECK_FIELDS = (DeckField.INPUT, DeckField.OUTPUT)
"""Flyte's own Decks shown beside ours (its dependency Deck runs ``pip freeze``, which says nothing here)."""

class ScalingTaskBase(PythonInstanceTask[C], Generic[C]):
    """A configured cluster operation with typed inputs (defaults from the config) and one typed output."""

    def __init__(
        self,
        name: str,
        task_config: C,
        task_type: str,
        inputs: Dict[str, Tuple[Any, Any]],
        output_type: Type,
        enable_deck: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("deck_fields", DECK_FIELDS)
        super().__init__(
            name=name,
            task_config=task_config,
            task_type=task_type,
            interface=Interface(inputs=inputs, outputs={OUTPUT_NAME: output_type}),
            enable_deck=enable_deck,
            **kwargs,
        )

    @property
    def name(self) -> str:
        """The task's Flyte name: qualified by the defining module unless the given name has a dot."""
        return qualified_name(self._name, self.instantiated_in)

    @property
    def short_name(self) -> str:
        """The name as given, e.g. ``scale_up`` (used in progress and summary lines)."""
        return self._name

    def reporter(self, cluster: str, goal: str = "waiting for {workers}") -> WaitReporter:
        """Progress for one run of this node: a bar naming the node and the full cluster name."""
        return default_reporter(Activity(self.short_name, str(parse_cluster(cluster)), goal))

    def get_custom(self, settings: SerializationSettings) -> Dict[str, Any]:
        """The configuration, for the container run and the connector."""
        return self.task_config.to_custom()  # type: ignore[attr-defined]

    def publish(self, title: str, timeline: WorkerTimeline, outcome: Any) -> None:
        """Attach the Deck of this run: the outcome's fields and the worker plot."""
        publish_deck(title, render_html(f"{title}: {self.name}", timeline, vars(outcome)))
