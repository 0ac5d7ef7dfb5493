"""``ddlscale run``: hold a cluster at a size for the length of a command.

The command-line twin of ``@distributed_phase``, for Domino Flows steps and
shell jobs: the same phase machinery (:mod:`..hold`: claim, scale, wait,
framework readiness, release and restore), with the command run as a child process
that gets the connection variables and the signals sent to ``ddlscale``.
"""
import shlex
import signal
import sys
from typing import Any, List, Optional, Tuple

import click

from ..backends._base import DEFAULT_SCALE_TIMEOUT
from ..errors import ClusterFaultError, ScalingError
from .._services.hold import ClusterPhase, PhaseInterrupted, cluster_phase
from .._core.leases import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS
from .._core.redaction import redact
from .._core.validation import validate_timeout
from .._core.progress import plural
from .child import DEFAULT_KILL_AFTER, CommandNotStarted, run_forwarding
from .cluster_commands import CREATE_HELP, Target, open_checked, require_existing, target_options
from .output import emit_error

RUN_EPILOG = (
    "Exit codes: the command's (128 + N when signal N ended it; 127 when it was not found, 126 when "
    "it could not be executed); when scaling fails before the command starts, or the restore fails "
    "after it succeeded, that error's code (listed in `ddlscale --help`)."
)


def _say(text: str) -> None:
    click.echo(redact(f"ddlscale run: {text}"), err=True)


@click.command(
    "run", epilog=RUN_EPILOG, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@target_options
@click.option("--replicas", type=int, required=True, help="Workers the command needs at least (a cluster found larger is not shrunk).")
@click.option("--worker-hw-tier", default=None, help="Hardware tier NAME for the workers.")
@click.option(
    "--timeout", type=float, default=DEFAULT_SCALE_TIMEOUT, show_default=True,
    help="Seconds the scale-up with its readiness checks may take; the restore gets as long again.",
)
@click.option(
    "--framework-ready/--no-framework-ready", default=True, show_default=True,
    help="Also wait until the workers are registered with Dask/Ray/Spark (where checkable).",
)
@click.option(
    "--fail-on-fault/--no-fail-on-fault", default=False, show_default=True,
    help="If the cluster loses its head or workers while COMMAND runs, stop COMMAND (SIGTERM) and exit 6, "
    "instead of repairing it (local backend) or reporting it.",
)
@click.option("--create", is_flag=True, help=CREATE_HELP + " A cluster the run created is removed after it.")
@click.option(
    "--lease-seconds", type=float, default=DEFAULT_LEASE_SECONDS, show_default=True,
    help="How long the claim outlives its last renewal (renewed every third of it): a ddlscale stopped or "
    f"hung longer loses it to other runs, a fault once it runs again (at most {MAX_LEASE_SECONDS:.0f}).",
)
@click.option(
    "--kill-after", type=float, default=DEFAULT_KILL_AFTER, show_default=True,
    help="Seconds the command gets to exit after a forwarded SIGTERM/SIGINT before it is killed.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(target: Target, kill_after: float, create: bool, command: Tuple[str, ...], **phase: Any) -> None:
    """Scale the cluster, run COMMAND with it, then restore the cluster.

    \b
    ddlscale run --kind dask --name NAME --replicas 4 -- python train.py --epochs 3

    Claims at least REPLICAS workers (a cluster found larger on the same
    tier is not shrunk), scales and waits for them, exports the connection
    variables (where the backend provides them; Domino sets them in a run)
    to COMMAND and runs it. When COMMAND exits, fails, or ddlscale gets
    SIGTERM/SIGINT (passed on to COMMAND), the claim is released and the
    cluster goes back to the largest remaining claim or the size it had
    before the phases. Concurrent runs and phases on one cluster never
    shrink each other. The claim is a lease renewed while ddlscale runs; if
    ddlscale is killed, the claim stops counting and COMMAND is killed too.
    A local cluster that does not exist is refused (exit 4) unless --create.
    A claim lost while COMMAND runs (ddlscale stopped past its lease) or a
    cluster scaled below REPLICAS is a fault: claimed again and put back,
    or, with --fail-on-fault, COMMAND stopped and exit 6.
    """
    # ``phase``: the phase options (replicas, worker_hw_tier, timeout, framework_ready, fail_on_fault,
    # lease_seconds), handed to cluster_phase as they are.
    try:
        ref = target.ref()
        grace = validate_timeout(kill_after, "kill_after")
        with open_checked(target.backend, ref) as chosen:
            if not create:
                require_existing(chosen, ref, " (or add --create to this command)")
        held = cluster_phase(ref, backend=target.backend, deck=False, label="run", **phase)
    except ScalingError as error:
        sys.exit(emit_error(error, as_json=False))
    sys.exit(_run_in_phase(held, list(command), grace))


def _run_in_phase(phase: ClusterPhase, argv: List[str], kill_after: float) -> int:
    """Run ``argv`` inside ``phase``; return the exit code ``ddlscale run`` ends with."""
    status: Optional[int] = None
    try:
        with phase:
            _say(f"{_ready(phase)}; running {shlex.join(argv)}")
            status = run_forwarding(argv, kill_after)
            if status != 0:
                phase.body_failure = f"exit {status}"
            _say(f"command exited with {status}; restoring {phase.ref}")
    except CommandNotStarted as error:
        _say(f"{error}; {_outcome(phase)}")
        return error.exit_code
    except PhaseInterrupted as interrupt:
        name = signal.Signals(interrupt.signum).name
        if status is None:
            _say(f"{name} before the command started; {_outcome(phase)}")
            return 128 + interrupt.signum
        _say(f"{name} arrived during the restore, which finished first")
    except ClusterFaultError as error:
        code = emit_error(error, as_json=False)
        ran = "before the command started" if status is None else f"the command was stopped (exit {status})"
        _say(f"a cluster fault failed the run: {ran}; {_outcome(phase)}")
        return code
    except ScalingError as error:
        code = emit_error(error, as_json=False)
        if status is None:
            _say(f"the command did not run; {_outcome(phase)}")
            return code
        _say(f"the command exited with {status}, but {_outcome(phase)}")
        return status or code
    # The phase's summary line (unless $DDLSCALE_QUIET) has said how the restore ended.
    return status if status is not None else 0


def _ready(phase: ClusterPhase) -> str:
    """``dask/x ready: 4 workers up, held at 4 (this command needs at least 1)``: what the cluster
    has, not only what the command asked for."""
    up, held, needed = phase.workers_up, phase.held_workers, phase.settings.replicas
    check = f"; {phase.framework_check}" if phase.framework_check else ""
    if up is None or held is None:
        return f"{phase.ref} ready{check}"
    if held == needed and up == held:
        return f"{phase.ref} ready with {plural(up, 'worker')}{check}"
    return f"{phase.ref} ready: {plural(up, 'worker')} up, held at {held} (this command needs at least {needed}){check}"


def _outcome(phase: ClusterPhase) -> str:
    """What the phase's cleanup did to the cluster, for the last line ``ddlscale run`` prints."""
    if phase.restore_error is not None:
        return f"restoring {phase.ref} failed: {phase.restore_error}"
    if phase.restored_to is None:
        return f"{phase.ref} unchanged"
    return f"{phase.ref} restored to {phase.restored_to}"
