"""What both connector protocols (flytekit's, Flyte 2's) share at their edge: a template's ``custom`` as
Python values, a poll's answer as the protocol's ``Resource``, and the one-line answer to a template
flytekit's own parse cannot read (:func:`unreadable_template`).
"""
import math
from typing import Any, Optional, Tuple

from google.protobuf.struct_pb2 import ListValue, Struct

from ..errors import InvalidInputError, ScalingError
from .connector_core import SUCCEEDED, Poll, node_config
from .nodes import NODE_KINDS
from .nodes.names import OUTPUT_NAME

FLYTEKIT_READABLE = "a task template flytekit's connector service can read"


def struct_values(value: Any) -> Any:
    """A protobuf ``Struct`` (or its values) as Python dictionaries, lists and scalars, NaN and infinity
    kept (protobuf's JSON conversion fails on them) so that the field's own check refuses them by name."""
    if isinstance(value, Struct):
        return {key: struct_values(item) for key, item in value.items()}
    if isinstance(value, ListValue):
        return [struct_values(item) for item in value]
    return value


def unreadable_template(template: Any) -> Optional[ScalingError]:
    """None when flytekit reads ``template`` (flyteidl's ``TaskTemplate`` of a ``ddlscale_*`` type); else
    the one-line error the connector answers for it: the node's own check of ``custom`` (as Flyte 2's
    connector answers the same template), else the first number flytekit cannot read (``custom.<path>``),
    else what flytekit's parse said (``template``)."""
    from flytekit.models.task import TaskTemplate

    try:
        TaskTemplate.from_flyte_idl(template)
        return None
    except Exception as error:  # noqa: BLE001 - whatever flytekit raises, the answer is one line
        unread = " ".join(f"{type(error).__name__}: {error}".split())
    custom = struct_values(template.custom) if template.HasField("custom") else None
    kind = NODE_KINDS.get(template.type)
    try:
        if kind is None:
            raise InvalidInputError("task_type", template.type, ", ".join(NODE_KINDS))
        node_config(kind.config, custom)
    except ScalingError as refused:
        return refused.with_traceback(None)
    found = _not_finite(custom, "custom")
    if found is not None:
        return InvalidInputError(found[0], found[1], f"a finite number ({FLYTEKIT_READABLE})")
    return InvalidInputError("template", unread, FLYTEKIT_READABLE)


def _not_finite(value: Any, path: str) -> Optional[Tuple[str, float]]:
    """The path and value of the first NaN or infinite number in ``value`` (Python values of a Struct)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _not_finite(item, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]")
        if found is not None:
            return found
    return None


def resource_of(answer: Poll, task_type: str, resource: Any, task_execution: Any, task_log: Any) -> Any:
    """``answer`` as the protocol's ``resource``: phase, message (the node's summary once SUCCEEDED), outcome
    as output ``o0``, links, and the counts with the message in ``custom_info`` (FlytePropeller drops the
    message of a RUNNING or SUCCEEDED answer; docs/connector.md)."""
    message = answer.message
    if answer.state == SUCCEEDED and task_type in NODE_KINDS and answer.outcome is not None:
        kind = NODE_KINDS[task_type]
        message = kind.summary(kind.node, answer.outcome, None)
    info = dict(answer.info, summary=message) if message else dict(answer.info)
    return resource(
        phase=getattr(task_execution, answer.state),
        message=message,
        outputs={OUTPUT_NAME: answer.outcome} if answer.state == SUCCEEDED else None,
        log_links=[task_log(name=name, uri=uri) for name, uri in answer.links] or None,
        custom_info=info or None,
    )
