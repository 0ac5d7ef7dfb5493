"""One check per option name, for every dataclass of options a user writes: a phase's, a node's.

A phase (:class:`~flytekitplugins_ddlscale._services.hold.settings.PhaseSettings`)
and the scaling nodes' configurations take options of the same names
(``cluster``, ``timeout``, ``backend``, ...). Each name has its one check
here (it names the field and the values allowed, and gives the value
kept, e.g. a stripped tier name), and every ``bool`` field is checked as
one. A class adds or replaces checks only for what its own fields mean
(:attr:`CheckedFields.checks`).
"""
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Callable, ClassVar, Dict, Mapping, Optional

from ..refs import cluster_text
from .validation import (
    validate_backend_name,
    validate_bool,
    validate_replicas,
    validate_tier_name,
    validate_timeout,
    validate_url,
)

Check = Callable[[Any], Any]
"""A field's check: the value to keep, or :class:`InvalidInputError` naming the field."""

FIELD_CHECKS: Dict[str, Check] = {
    "cluster": cluster_text,
    "replicas": validate_replicas,
    "worker_hw_tier": validate_tier_name,
    "head_hw_tier": partial(validate_tier_name, field="head_hw_tier"),
    "timeout": validate_timeout,
    "backend": validate_backend_name,
    "framework_url": validate_url,
}
"""The check of each option name wherever it appears."""


class CheckedFields:
    """A (frozen) dataclass whose fields are checked, and normalised, when it is made.

    Each field gets the class's own check of that name (:attr:`checks`),
    else the shared one (:data:`FIELD_CHECKS`), else, for a ``bool``
    field, the check that it is one; checks run in the fields' order.
    """

    checks: ClassVar[Mapping[str, Check]] = {}
    """Checks of what this class's fields mean beyond the shared ones (replacing a shared one of the same name)."""

    def __post_init__(self) -> None:
        for field in fields(self):  # type: ignore[arg-type]
            check = self.checks.get(field.name) or FIELD_CHECKS.get(field.name)
            if check is None and field.type is bool:
                check = partial(validate_bool, field=field.name)
            if check is not None:
                object.__setattr__(self, field.name, check(getattr(self, field.name)))


@dataclass(frozen=True)
class SizedCluster(CheckedFields):
    """What every request to hold a cluster at a size starts with: a phase's, a ``ScaleCluster``'s."""

    cluster: str
    """``kind/name``, ``namespace/kind/name``, or a bare kind for the run's own cluster."""
    replicas: int
    """The worker count to set."""
    worker_hw_tier: Optional[str] = None
    """The workers' hardware tier; None keeps the current one."""
    head_hw_tier: Optional[str] = None
    """The head's hardware tier; None keeps the current one."""
