"""The one timeout contract of every backend: a change whose wait fails stays in place.

When the wait after a scale, reconcile or restore times out
(:class:`ScalingTimeoutError`) or a new worker cannot start
(:class:`WorkerFailedError`), no backend rolls the change back behind the
caller's back: the size it set stays, so late workers still arrive. The
error then says what was left in place and gives the exact ``ddlscale``
command and Python call that undo it (restore the baseline) or, after a
restore, that keep waiting for it. Backends build that text here, once.

The same contract makes a wait that can never end fail at once: a wait for
more workers than the cluster desires (or than its maximum) raises
:class:`UnreachableWaitError` instead of running out its timeout.
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
    """How a shell or a new Python process reaches the same cluster and the same records.

    ``env`` holds the variables a ``ddlscale`` command needs in front of it
    (only those that differ from the caller's environment, e.g. a private
    ``DDLSCALE_STATE_DIR``); ``options`` the ``get_backend`` keywords of the
    Python call. ``cli`` False means the CLI cannot reach these records (a
    state directory it cannot be pointed at), so only the Python call is given.
    """

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
    """The ``$DDLSCALE_STATE_DIR`` setting that makes ``ddlscale`` use ``directory`` as its ``subdir``.

    Empty when this environment already points there; None when no setting
    can (the directory is not named ``subdir``).
    """
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
    """``error`` (of the wait after a change), extended with what the change left in place and the remedy.

    ``setting`` names what holds the size (``spec.worker.replicas``,
    ``desired_workers``) and ``desired`` what the change set it to;
    ``found``, when the wait read the cluster after the change, is what the
    setting held then (an autoscaler may have raised it above a held
    minimum): the error reports that, not what was sent. After a scale or a
    reconcile to a claim (``restoring`` False) the remedy restores the
    baseline; after a restore, whose baseline record is already cleared, it
    waits for the restore. The same fields are set as
    :attr:`ScalingError.left_in_place`, :attr:`ScalingError.remedy_command`
    and :attr:`ScalingError.remedy_call`.
    """
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
    change (a phase restores the cluster when it fails): the text says ``restored`` (what the cluster
    was set to) instead of what was left in place, and no remedy is needed any more. An error that
    left nothing in place is returned unchanged."""
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
    """Raise :class:`UnreachableWaitError` when a wait for ``replicas`` workers could never end.

    ``cluster`` is what the error takes (``desired``, ``maximum``, ``cluster``, and optionally the
    names of the two settings and the state): the error holds the limit, so the rule and its
    message come from one place. A wait is done only while the cluster desires at least
    ``replicas`` workers (:func:`~flytekitplugins_ddlscale.models.workers_reached`), so a count
    above the desired one (or above the maximum) can only run out the wait's timeout.
    """
    error = UnreachableWaitError(replicas, **cluster)
    if replicas > error.limit:
        raise error
