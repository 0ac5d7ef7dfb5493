"""The flytekit task of a scaling node: a Python task with no user function, built from its node type's kind.

A ``PythonInstanceTask`` (found in a container by module and variable name, like ``ShellTask``), its
configuration also in the template's ``custom`` for the connector. Task options go into ``TaskMetadata`` as
``@task`` puts them; the Flyte timeout is the node's own plus :data:`FLYTE_TIMEOUT_GRACE`; a cache is refused.
"""
import dataclasses
import datetime
import functools
import inspect
import threading
import time
from typing import Any, ClassVar, Dict, Generic, Optional, Tuple, TypeVar

from flytekit import TaskMetadata
from flytekit.configuration import SerializationSettings
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.interface import Interface
from flytekit.core.python_function_task import PythonInstanceTask
from flytekit.core.tracked_abc import FlyteTrackedABC
from flytekit.deck import DeckField

from .._core.deck import publish_deck, render_html
from .._core.progress import Activity, default_reporter, emit_line
from .._core.validation import validate_bool, validate_int
from .._services.nodes import interrupted
from .._services.nodes.kinds import NodeKind
from .._services.nodes.names import OUTPUT_NAME, qualified_name
from .._services.recoverable import recoverable_in_pod
from ..errors import InvalidInputError
from ..refs import ClusterRef, parse_cluster

C = TypeVar("C")

FLYTE_TIMEOUT_GRACE = 300.0
"""Seconds the template's Flyte timeout adds to the node's ``timeout``: time for the pod to start (container
mode) or for FlytePropeller's next GetTask to read the node's own FAILED answer (connector mode)."""

OWN_OPTIONS = ("retries", "interruptible", "cache")
"""The options a node takes as ``@task`` does, beside flytekit's task-class keywords."""

DECK_FIELDS = (DeckField.INPUT, DeckField.OUTPUT)
"""Flyte's own Decks shown beside ours (its dependency Deck runs ``pip freeze``, which says nothing here)."""

_TASK_OPTIONS = inspect.Parameter("task_options", inspect.Parameter.VAR_KEYWORD, annotation=Any)


class _NodeTypeMeta(FlyteTrackedABC):
    """flytekit's task metaclass, and a node type's constructor signature for ``help()`` and notebooks
    (flytekit's wraps every constructor in ``(*args, **kwargs)``; a property here answers for the class only)."""

    @property
    def __signature__(cls) -> Optional[inspect.Signature]:  # noqa: N805 - a metaclass property
        kind = cls.__dict__.get("kind")
        return kind.signature(_TASK_OPTIONS) if kind is not None else None


@functools.lru_cache(maxsize=None)
def _task_option_names() -> Tuple[str, ...]:
    """The keywords flytekit's task classes name (its base ``Task`` quietly drops any other keyword) but
    those the node sets, and ``@task``'s :data:`OWN_OPTIONS`; read once, when the first node is defined."""
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
    """A configured cluster operation: inputs, output, run and wording from the subclass's :class:`NodeKind`;
    constructed from the node's name, its configuration's fields (in their order or by keyword) and
    flytekit's task options."""

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
        """Run the node with its inputs, publish the Deck, print the summary line and return the outcome (in a
        task pod the backend unavailable for now is recoverable, so Flyte applies ``retries``)."""
        started = time.monotonic()
        with recoverable_in_pod():
            ref = parse_cluster(kwargs.get("cluster", self.task_config.cluster))  # type: ignore[attr-defined]
            if self.kind.changes_cluster:
                _remember(self.task_config.backend, ref)  # type: ignore[attr-defined]
            activity = Activity(self.short_name, str(ref), self.kind.goal)
            with default_reporter(activity) as progress:
                outcome, timeline = self.kind.perform(self.task_config, kwargs, progress)
        publish_deck(self.kind.title, render_html(f"{self.kind.title}: {self.name}", timeline, vars(outcome)))
        emit_line(self.kind.summary(self.short_name, outcome, time.monotonic() - started))
        return outcome

    def get_custom(self, settings: SerializationSettings) -> Dict[str, Any]:
        """The configuration, for the container run and the connector."""
        return self.task_config.to_custom()  # type: ignore[attr-defined]


def task_metadata(kind: NodeKind, timeout: float, options: Dict[str, Any]) -> Dict[str, Any]:
    """``options`` with :data:`OWN_OPTIONS` and ``metadata`` turned into the one ``metadata=TaskMetadata``.

    Raises :class:`InvalidInputError` naming the option for a cache asked for (``cache``, ``metadata.cache``),
    a bad ``retries`` or ``interruptible``, a ``metadata.timeout`` (the node's ``timeout`` sets it), and
    TypeError for ``retries``/``interruptible`` given both as keywords and in ``metadata``.
    """
    rest = dict(options)
    cache = rest.pop("cache", False)
    if cache is not False and cache is not None:
        _refuse_cache(kind, "cache", cache)
    given = {name: rest.pop(name) for name in ("retries", "interruptible") if name in rest}
    metadata = rest.pop("metadata", None)
    if metadata is None:
        metadata = TaskMetadata()
    elif not isinstance(metadata, TaskMetadata):
        raise InvalidInputError("metadata", type(metadata).__name__, "a flytekit TaskMetadata")
    elif given:
        raise TypeError(
            f"{kind.node}: {sorted(given)[0]} given both as a keyword and in metadata=; give retries and "
            "interruptible as keywords (as @task takes them) or in metadata=TaskMetadata(...), not both"
        )
    if metadata.cache:
        _refuse_cache(kind, "metadata.cache", metadata.cache)
    if metadata.timeout is not None:
        raise InvalidInputError(
            "metadata.timeout", metadata.timeout, "None (the node's timeout= sets it)",
            reason=f"{kind.node} ends itself at its own timeout, which the template's Flyte timeout follows",
        )
    if "retries" in given:
        given["retries"] = validate_int(given["retries"], "retries", 0)
    if given.get("interruptible") is not None:
        validate_bool(given["interruptible"], "interruptible")
    rest["metadata"] = dataclasses.replace(
        metadata, timeout=datetime.timedelta(seconds=timeout + FLYTE_TIMEOUT_GRACE), **given
    )
    return rest


def _refuse_cache(kind: NodeKind, option: str, value: Any) -> None:
    why = f"{kind.node} must run every time: {kind.cached}"
    raise InvalidInputError(option, value, "False (the default)", reason=why)


_hooked = threading.Lock()
_hook_installed = False


def _remember(backend: Optional[str], ref: ClusterRef) -> None:
    """Note that this process is changing ``ref`` through ``backend``; the first call hooks the Ctrl-C report
    (:func:`~.._services.nodes.interrupted.report_left_running`) into flytekit's signal-handler hook."""
    global _hook_installed
    interrupted.remember(backend, ref)
    with _hooked:
        if _hook_installed:
            return
        _hook_installed = True
    FlyteContextManager.add_signal_handler(lambda signum, frame: interrupted.report_left_running())
