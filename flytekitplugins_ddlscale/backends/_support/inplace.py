"""The one timeout contract of every backend: a change whose wait fails stays in place.

No backend rolls a change back behind the caller's back (late workers still
arrive): the error says what was left in place and gives the ``ddlscale``
command and Python call that undo it, or after a restore keep waiting. A wait
that can never end (more workers than the cluster desires or can have) raises
:class:`UnreachableWaitError` at once.
"""
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Union

from ...errors import ScalingError, UnreachableWaitError
from ..._core import settings
from .filestore import default_state_dir
from ...models import ClusterState
from ..._core.redaction import redact
from ...refs import ClusterRef

OptionValue = Union[str, int]


@dataclass(frozen=True)
class Reach:
    """How a shell or a new Python process reaches the same cluster and records: the variables a
    ``ddlscale`` command needs in front of it (``env``), the ``get_backend`` keywords of the Python
    call (``options``); ``cli`` False when no command can reach these records (only the call is given)."""

    backend: str
    ref: ClusterRef
    env: Dict[str, str] = field(default_factory=dict)
    options: Dict[str, OptionValue] = field(default_factory=dict)
    cli: bool = True

    def command(self, verb: str, *extra: str) -> Optional[str]:
        """The shell command ``ddlscale <verb> ...`` for this cluster, or None when the CLI cannot reach it."""
        if not self.cli:
            return None
        words = [f"{name}={shlex.quote(value)}" for name, value in self.env.items()]
        words += ["ddlscale", verb, "--backend", self.backend, "--kind", self.ref.kind, "--name", self.ref.name]
        if self.ref.namespace:
            words += ["--namespace", self.ref.namespace]
        if self.ref.group is not None:
            words += ["--group", shlex.quote(self.ref.group)]
        return " ".join(words + [shlex.quote(word) for word in extra])

    def call(self, method: str, *args: OptionValue) -> str:
        """The Python call ``get_backend(...).<method>(ClusterRef(...), *args)`` for this cluster."""
        options = "".join(f", {name}={json.dumps(value)}" for name, value in self.options.items())
        ref_args = [json.dumps(a) for a in [self.ref.kind, self.ref.name] + ([self.ref.namespace] if self.ref.namespace else [])]
        if self.ref.group is not None:
            ref_args.append(f"group={json.dumps(self.ref.group)}")
        ref = f"ClusterRef({', '.join(ref_args)})"
        rest = "".join(f", {json.dumps(a)}" for a in args)
        return f"get_backend({json.dumps(self.backend)}{options}).{method}({ref}{rest})"


def state_dir_env(directory: Path, subdir: str) -> Optional[Dict[str, str]]:
    """The ``$DDLSCALE_STATE_DIR`` setting that makes ``ddlscale`` use ``directory`` as its ``subdir``:
    empty when this environment already points there, None when no setting can."""
    directory = directory.resolve()
    if directory == (default_state_dir() / subdir).resolve():
        return {}
    if directory.name != subdir:
        return None
    return {settings.STATE_DIR.name: str(directory.parent)}


def workers_seen(state: Optional[ClusterState], desired: int, found: Optional[int] = None) -> str:
    """How far ``state`` got towards ``desired`` workers, in words; ``found`` is the size the cluster
    wanted when last seen, reported instead of ``desired`` where the two differ."""
    if state is None:
        return "the workers were never observed"
    wanted = desired if found is None else found
    needed = f", at least {desired} needed" if wanted != desired else ""
    if state.ready_workers is None:
        return f"{state.existing_workers} of {wanted} worker pods exist (readiness not observable){needed}"
    return f"{state.ready_workers} of {wanted} workers ready{needed}"


def left_in_place(
    error: ScalingError, reach: Reach, setting: str, desired: int, *, restoring: bool, found: Optional[int] = None
) -> ScalingError:
    """``error`` of the wait after a change that set ``setting`` to ``desired`` (``found``: what a later read
    saw there, reported instead), extended with what was left in place and the remedy (restore the baseline;
    after a restore, keep waiting), also set as ``left_in_place``, ``remedy_command`` and ``remedy_call``."""
    now = desired if found is None else found
    error.wait_message = error.message
    error.left_in_place = f"{setting}={now}"
    seen = workers_seen(error.state, desired, found)
    changed = ""
    if now != desired:
        changed = f" (this change set {desired}; since changed by the autoscaler or another client)"
    if restoring:
        # A wait for more than the cluster now wants could never end (it is refused as unreachable).
        error.remedy_command = reach.command("status", "--wait")
        error.remedy_call = reach.call("wait_for_workers", min(desired, now))
        what = (
            f"{error.left_in_place} (the restore) left in place{changed}: {seen}; nothing was rolled back and "
            f"the baseline record was cleared with the restore. To keep waiting for it"
        )
    else:
        error.remedy_command = reach.command("restore")
        error.remedy_call = reach.call("restore_baseline")
        what = f"{error.left_in_place} left in place{changed}: {seen}; nothing was rolled back. To restore the baseline"
    how = f"`{error.remedy_command}` (Python: `{error.remedy_call}`)" if error.remedy_command else f"`{error.remedy_call}`"
    error.message = redact(f"{error.message}. {what}: {how}")
    error.args = (error.message,)
    return error


def given_back(error: ScalingError, restored: str) -> ScalingError:
    """``error`` of a failed wait (extended by :func:`left_in_place`) once its caller has undone the
    change: it says what the cluster was set to (``restored``) and needs no remedy any more."""
    if error.left_in_place is None or error.wait_message is None:
        return error
    error.message = redact(
        f"{error.wait_message}. The change ({error.left_in_place}) was then undone: the cluster was set to "
        f"{restored}; nothing is left in place"
    )
    error.args = (error.message,)
    error.left_in_place = error.remedy_command = error.remedy_call = None
    return error


def check_reachable(replicas: int, **cluster: Any) -> None:
    """Raise :class:`UnreachableWaitError` when a wait for ``replicas`` workers could never end (more
    than the cluster desires or can have); ``cluster`` is what the error takes (``desired``,
    ``maximum``, ``cluster``, the settings' names, the state)."""
    error = UnreachableWaitError(replicas, **cluster)
    if replicas > error.limit:
        raise error
