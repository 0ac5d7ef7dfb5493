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
import functools
import inspect
import time
from typing import Any, ClassVar, Dict, Generic, Optional, Tuple, TypeVar

from flytekit.configuration import SerializationSettings
from flytekit.deck import DeckField
from flytekit.core.interface import Interface
from flytekit.core.python_function_task import PythonInstanceTask
from flytekit.core.tracked_abc import FlyteTrackedABC

from .._core.deck import publish_deck, render_html
from .._services.nodes.kinds import NodeKind
from .._services.nodes.names import OUTPUT_NAME, qualified_name
from .._services.recoverable import recoverable_in_pod
from .._core.progress import Activity, emit_summary, default_reporter
from ..refs import parse_cluster
from .leftovers import remember
from .options import OWN_OPTIONS, task_metadata

C = TypeVar("C")

DECK_FIELDS = (DeckField.INPUT, DeckField.OUTPUT)
"""Flyte's own Decks shown beside ours (its dependency Deck runs ``pip freeze``, which says nothing here)."""

_TASK_OPTIONS = inspect.Parameter("task_options", inspect.Parameter.VAR_KEYWORD, annotation=Any)


class _NodeTypeMeta(FlyteTrackedABC):
    """flytekit's task metaclass, and a node type's constructor signature for ``help()`` and notebooks.

    flytekit's metaclass wraps every constructor in ``(*args, **kwargs)``; a
    property here answers for the class only, so a node's own ``__call__``
    keeps its signature.
    """

    @property
    def __signature__(cls) -> Optional[inspect.Signature]:  # noqa: N805 - a metaclass property
        kind = cls.__dict__.get("kind")
        return kind.signature(_TASK_OPTIONS) if kind is not None else None


@functools.lru_cache(maxsize=None)
def _task_option_names() -> Tuple[str, ...]:
    """The keywords flytekit's task classes name (its base ``Task`` quietly drops any other keyword) but
    those the node sets, and ``@task``'s ``retries``, ``interruptible`` and ``cache``
    (:mod:`.options`); read once, when the first node is defined."""
    names = set()
    for base in PythonInstanceTask.__mro__:
        if "__init__" in vars(base):
            names.update(
                parameter.name for parameter in inspect.signature(base.__init__).parameters.values()
                if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            )
    return tuple(sorted((names - set(_SET_BY_NODE)) | set(OWN_OPTIONS)))


_SET_BY_NODE = ("self", "name", "task_config", "task_type", "interface", "task_type_version")
"""The task arguments a node type sets itself, not the user (the connector serves task type version 0 only)."""


class ScalingTaskBase(PythonInstanceTask[C], Generic[C], metaclass=_NodeTypeMeta):
    """A configured cluster operation: inputs, output, run and wording from the subclass's :class:`NodeKind`.

    The constructor takes the node's name, its configuration's fields
    (positionally in their order or by keyword) and flytekit's task options
    (``retries``, ``interruptible`` as ``@task`` takes them; :mod:`.options`).
    """

    kind: ClassVar[NodeKind]

    def __init__(self, name: str, *fields: Any, **options: Any) -> None:
        # A keyword flytekit does not name would vanish in its Task's **kwargs: configure refuses it.
        task_config, task_options = self.kind.configure(fields, options, _task_option_names())
        task_options = task_metadata(self.kind, task_config.timeout, task_options)  # type: ignore[attr-defined]
        task_options.setdefault("deck_fields", DECK_FIELDS)
        task_options.setdefault("enable_deck", True)
        super().__init__(
            name=name,
            task_config=task_config,
            task_type=self.kind.task_type,
            interface=Interface(inputs=self.kind.interface(task_config), outputs={OUTPUT_NAME: self.kind.output}),
            **task_options,
        )

    @property
    def name(self) -> str:
        """The task's Flyte name: qualified by the defining module unless the given name has a dot."""
        return qualified_name(self._name, self.instantiated_in)

    @property
    def short_name(self) -> str:
        """The name as given, e.g. ``scale_up`` (used in progress and summary lines)."""
        return self._name

    def execute(self, **kwargs: Any) -> Any:
        """Run the node with its inputs; publish the Deck; print the summary line; return the outcome.

        In a task pod, the backend being unavailable for now is raised as recoverable, so Flyte applies
        the task's ``retries`` (:mod:`.._services.recoverable`).
        """
        started = time.monotonic()
        with recoverable_in_pod():
            ref = parse_cluster(kwargs.get("cluster", self.task_config.cluster))  # type: ignore[attr-defined]
            if self.kind.changes_cluster:
                remember(self.task_config.backend, ref)  # type: ignore[attr-defined]
            activity = Activity(self.short_name, str(ref), self.kind.goal)
            with default_reporter(activity) as progress:
                outcome, timeline = self.kind.perform(self.task_config, kwargs, progress)
        publish_deck(self.kind.title, render_html(f"{self.kind.title}: {self.name}", timeline, vars(outcome)))
        emit_summary(self.kind.summary(self.short_name, outcome, time.monotonic() - started))
        return outcome

    def get_custom(self, settings: SerializationSettings) -> Dict[str, Any]:
        """The configuration, for the container run and the connector."""
        return self.task_config.to_custom()  # type: ignore[attr-defined]
