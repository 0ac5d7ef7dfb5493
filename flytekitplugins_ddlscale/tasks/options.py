"""The flytekit task options of a scaling node: ``retries``, ``interruptible`` and ``timeout`` as ``@task`` takes them.

``retries=N`` and ``interruptible=True`` go into the task's
``TaskMetadata`` as ``@task(retries=..., interruptible=...)`` would put
them (or come in ``metadata=TaskMetadata(...)``, not both). ``timeout`` is
the node's own field: the node ends itself then, failing with what it waited
for and what it left in place, and the template's Flyte timeout is that plus
:data:`FLYTE_TIMEOUT_GRACE`, FlytePropeller's backstop, so Flyte does not
cut the node's own answer short. A cache is refused: a node acts on or reads
the cluster as it is now, which its inputs do not describe (each node type
says why, ``NodeKind.cached``). ``task_type_version`` is the node type's,
not the user's: the connector serves version 0 only.
"""
import dataclasses
import datetime
from typing import Any, Dict

from flytekit import TaskMetadata

from ..errors import InvalidInputError
from .._core.validation import validate_bool, validate_int
from .._services.nodes.kinds import NodeKind

FLYTE_TIMEOUT_GRACE = 300.0
"""Seconds the template's Flyte timeout adds to the node's ``timeout``: time for the pod to start (container
mode) or for FlytePropeller's next GetTask to read the node's own FAILED answer (connector mode)."""

OWN_OPTIONS = ("retries", "interruptible", "cache")
"""The options a node takes as ``@task`` does, beside flytekit's task-class keywords."""


def task_metadata(kind: NodeKind, timeout: float, options: Dict[str, Any]) -> Dict[str, Any]:
    """``options`` with :data:`OWN_OPTIONS` and ``metadata`` turned into the one ``metadata=TaskMetadata``.

    Raises :class:`InvalidInputError` naming the option for a cache asked for
    (``cache``, ``metadata.cache``), a bad ``retries`` or ``interruptible``, a
    ``metadata.timeout`` (the node's ``timeout`` sets it), and TypeError for
    ``retries``/``interruptible`` given both as keywords and in ``metadata``.
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
