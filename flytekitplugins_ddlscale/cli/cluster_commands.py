"""``ddlscale status|scale|restart-head|restore``: the backend protocol on the command line.

Every command names the cluster (``--kind`` and ``--name``, or ``--run-id``, else ``$DOMINO_RUN_ID``),
and takes ``--backend``, ``--wait/--no-wait``, ``--timeout`` and ``--json``; exit codes are in
:mod:`.output`. Nothing creates a cluster by accident: where a scale would create a missing cluster (the
local backend), ``scale`` refuses it (exit 4) unless given ``--create``; ``restore`` never creates one.
"""
import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

import click

from ..backends import available_backends, get_backend
from ..backends._base import DEFAULT_RESTART_TIMEOUT, DEFAULT_SCALE_TIMEOUT, ClusterBackend
from ..errors import ClusterNotFoundError, InvalidInputError, ScalingError
from .._services.readiness import FrameworkOptions, ReadinessCheck
from ..models import ReplicaSpec
from .._core import settings
from .._core.progress import ProgressReporter, default_reporter
from ..refs import GROUPED_KINDS, KIND_NAMES, ClusterRef
from .._core.waiting import PROBE_GRACE, Deadline, within
from .output import Confirmed, WithClaims, emit, emit_error


KIND_HELP = f"Cluster kind: {', '.join(KIND_NAMES)} (any case)."
BACKEND_HELP = f"{', '.join(sorted(available_backends()))} (default: from the environment)."
GROUP_HELP = f"Worker group ({' and '.join(GROUPED_KINDS)} clusters; default: the only one / default)."
CREATE_HELP = (
    "Create the cluster if it does not exist (local backend: the scale would start one). "
    "Without it a missing cluster is refused (exit 4)."
)

IDENTITY = ("backend", "kind", "name", "run_id", "namespace", "group")
"""The options that name the cluster and the backend asked about it, as :class:`Target` holds them."""


@dataclass(frozen=True)
class Target:
    """The cluster a command names and the backend it asks (None: as the environment selects)."""

    backend: Optional[str]
    kind: str
    name: Optional[str]
    run_id: Optional[str]
    namespace: Optional[str]
    group: Optional[str]

    def ref(self) -> ClusterRef:
        """``--name`` (and ``--group``), else ``--run-id``, else ``$DOMINO_RUN_ID``; :class:`InvalidInputError`
        naming ``name`` when none is given."""
        if self.name is not None:
            return ClusterRef(self.kind, self.name, self.namespace, self.group)
        if self.run_id is None and not settings.DOMINO_RUN_ID.is_set():
            raise InvalidInputError(
                "name", None, "--name NAME, --run-id ID, or $DOMINO_RUN_ID (the run's own cluster <kind>-<run id>)",
                reason="give --name (or --run-id) outside a Domino run",
            )
        return ClusterRef.for_run(self.kind, self.run_id, self.namespace)


def target_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The identity options (:data:`IDENTITY`), handed to ``command`` as one :class:`Target` (``target``)."""

    @functools.wraps(command)
    def wrapper(**options: Any) -> Any:
        target = Target(*(options.pop(key) for key in IDENTITY))
        return command(target=target, **options)

    options = [
        click.option("--backend", default=None, help=BACKEND_HELP),
        click.option("--kind", required=True, help=KIND_HELP),
        click.option("--name", default=None, help="Cluster name."),
        click.option("--run-id", default=None, help="Domino run id: the cluster is <kind>-<run id>."),
        click.option("--namespace", default=None, help="Namespace (default: the backend's)."),
        click.option("--group", default=None, help=GROUP_HELP),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def _wait_options(default_wait: bool, default_timeout: float) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.option("--wait/--no-wait", default=default_wait, show_default=True, help="Wait until done."),
            click.option("--timeout", type=float, default=default_timeout, show_default=True, help="Seconds to wait at most."),
            click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text."),
        ]
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _framework_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--framework-url", default=None,
        help="URL of the cluster head's dashboard / web UI (default: from the environment, see docs/readiness.md).",
    )(command)
    return click.option(
        "--framework-check/--no-framework-check", default=True, show_default=True,
        help="With --wait, also wait until the workers registered with Dask/Ray/Spark where the head is reachable.",
    )(command)


def require_existing(backend: ClusterBackend, ref: ClusterRef, remedy: str = "") -> None:
    """Refuse (:class:`ClusterNotFoundError`, exit 4) a cluster that does not exist on a backend whose
    scale would create it (``capabilities.creates_clusters``); the error names the command that
    creates it, then ``remedy``. Other backends answer "not found" themselves and are not read here."""
    if not backend.capabilities.creates_clusters:
        return
    try:
        # Only whether it exists is asked (its record): a hung head gets one PROBE_GRACE, not a full check.
        with within(Deadline(PROBE_GRACE)):
            backend.get_state(ref)
    except ClusterNotFoundError as error:
        raise ClusterNotFoundError(f"{error.message}{remedy}", cluster=error.cluster) from None


def open_checked(name: Optional[str], ref: ClusterRef) -> ClusterBackend:
    """The backend called ``name`` (None: as the environment selects), after refusing a kind it does not
    serve as bad input (exit 2, as ``ddlscale local`` does); the caller closes it."""
    backend = get_backend(name)
    try:
        backend.check_kind(ref)
    except ScalingError:
        backend.close()
        raise
    return backend


@dataclass(frozen=True)
class Call:
    """How a command runs: whether and how long it waits, its progress, the framework check."""

    wait: bool
    timeout: float
    progress: Optional[ProgressReporter]
    framework: FrameworkOptions = FrameworkOptions()


def _run(command: Callable[..., Any]) -> Callable[..., Any]:
    """Build the ref, the backend and the :class:`Call`, run ``command``, print its result, map errors to
    exit codes. Without ``--create`` (where a command has it), a missing cluster is refused first."""

    @functools.wraps(command)
    def wrapper(target: Target, wait: bool, timeout: float, as_json: bool, **options: Any) -> None:
        ctx = click.get_current_context()
        chosen = None
        progress = None
        try:
            framework = FrameworkOptions(options.pop("framework_check", True), options.pop("framework_url", None))
            ref = target.ref()
            chosen = open_checked(target.backend, ref)
            if wait:
                framework.check(ref.kind)
            if not options.pop("create", True):
                require_existing(chosen, ref, " (or add --create to this command)")
            progress = default_reporter() if wait else None
            result = command(chosen, ref, Call(wait, timeout, progress, framework), **options)
        except ScalingError as error:
            ctx.exit(emit_error(error, as_json))
        finally:
            # A wait that failed leaves its live bar or heartbeat running until closed.
            if progress is not None:
                progress.close()
            if chosen is not None:
                chosen.close()
        emit(result, as_json)

    return wrapper


@click.command("status")
@target_options
@_wait_options(default_wait=False, default_timeout=DEFAULT_SCALE_TIMEOUT)
@_framework_options
@_run
def status(backend: ClusterBackend, ref: ClusterRef, call: Call) -> Any:
    """Show the cluster's state and its live claims (holder, age); with --wait, once its desired
    workers are up (and registered). Claims whose holder is gone (or whose lease ran out) are
    dropped first, and what they held given back (logged)."""
    deadline = Deadline(call.timeout)
    # Whoever notices a dead claim first gives back what it held (logged with its holder).
    backend.give_back(ref)
    state = backend.get_state(ref)
    if not call.wait:
        return WithClaims(state, backend.claims(ref))
    state = backend.wait_for_workers(ref, state.desired_workers, timeout=call.timeout, progress=call.progress)
    check = ReadinessCheck(backend, ref, call.framework, call.progress)
    readiness = check.ready(state, state.desired_workers, deadline.remaining)
    return WithClaims(Confirmed(state, readiness), backend.claims(ref))


@click.command("scale")
@target_options
@_wait_options(default_wait=True, default_timeout=DEFAULT_SCALE_TIMEOUT)
@click.option("--replicas", type=int, required=True, help="Worker count wanted.")
@click.option("--worker-hw-tier", default=None, help="Hardware tier NAME for the workers.")
@click.option("--strict", is_flag=True, help="Refuse (exit 2) instead of capping at maxReplicas.")
@click.option("--create", is_flag=True, help=CREATE_HELP)
@_framework_options
@_run
def scale(
    backend: ClusterBackend, ref: ClusterRef, call: Call, replicas: int, worker_hw_tier: Optional[str], strict: bool
) -> Any:
    """Set the worker count (and tier); records the baseline first. With --wait, returns once
    the workers are up and, where the head is reachable, registered with the framework."""
    deadline = Deadline(call.timeout)
    result = backend.scale(
        ref, replicas, worker_hw_tier, wait=call.wait, timeout=call.timeout, strict=strict, progress=call.progress
    )
    if not call.wait:
        return result
    check = ReadinessCheck(backend, ref, call.framework, call.progress)
    return Confirmed(result, check.change(result, deadline.remaining))


@click.command("restart-head")
@target_options
@_wait_options(default_wait=True, default_timeout=DEFAULT_RESTART_TIMEOUT)
@click.option("--head-hw-tier", default=None, help="Hardware tier NAME for the new head (not every backend can).")
@_run
def restart_head(backend: ClusterBackend, ref: ClusterRef, call: Call, head_hw_tier: Optional[str]) -> Any:
    """Replace the head pod; with --wait, until the new head is Ready."""
    return backend.restart_head(ref, head_hw_tier, wait=call.wait, timeout=call.timeout, progress=call.progress)


@click.command("restore")
@target_options
@_wait_options(default_wait=True, default_timeout=DEFAULT_SCALE_TIMEOUT)
@click.option("--replicas", type=int, default=None, help="Restore to this count instead of the recorded baseline.")
@click.option("--worker-hw-tier", default=None, help="With --replicas: the workers' tier NAME.")
@_framework_options
@_run
def restore(
    backend: ClusterBackend, ref: ClusterRef, call: Call, replicas: Optional[int], worker_hw_tier: Optional[str]
) -> Any:
    """Put the cluster back to its recorded baseline (or --replicas) and forget the baseline. With
    --wait, returns once the removed workers are gone and, where the head is reachable, the
    framework has dropped them. Never creates a cluster."""
    if worker_hw_tier is not None and replicas is None:
        raise InvalidInputError(
            "worker_hw_tier", worker_hw_tier, "only together with --replicas N",
            reason="the baseline restores its own tier; give --replicas N to restore to another size and tier",
        )
    if replicas is not None:
        # Without --replicas a restore of a missing cluster starts nothing (it only forgets a stale baseline).
        require_existing(backend, ref)
    target = ReplicaSpec(replicas, worker_hw_tier) if replicas is not None else None
    deadline = Deadline(call.timeout)
    result = backend.restore_baseline(ref, target, wait=call.wait, timeout=call.timeout, progress=call.progress)
    if not call.wait:
        return result
    check = ReadinessCheck(backend, ref, call.framework, call.progress)
    return Confirmed(result, check.change(result, deadline.remaining))


def register_cluster_commands(group: click.Group) -> None:
    """Add status, scale, restart-head and restore to ``group``."""
    for command in (status, scale, restart_head, restore):
        group.add_command(command)
