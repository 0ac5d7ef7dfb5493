"""How CLI results and errors are printed: JSON for scripts, one-liners for people.

Everything printed goes through :func:`redact`, so credentials never reach a
terminal or a CI log even if an error message carried one.
"""
import dataclasses
import datetime
import json
from typing import Any, Dict

import click

from ..errors import (
    AccessError, CapacityExceededError, ClusterFaultError, ClusterNotFoundError, InvalidInputError, NeverReachedError,
    ScalingError, ScalingTimeoutError, StateWriteError, TransientError,
)
from .._services.readiness import Readiness
from .._core.leases import age_seconds
from ..models import Baseline, ClusterState, RestartResult, ScaleResult, utcnow
from .._core.records import Claim
from .._core.redaction import redact
from .._core.progress import plural

EXIT_OK = 0
EXIT_OTHER = 1
EXIT_BAD_INPUT = 2
EXIT_TIMEOUT = 3
EXIT_NOT_FOUND = 4
EXIT_UNAUTHORIZED = 5
EXIT_UNAVAILABLE = 6
EXIT_STATE_UNWRITABLE = 8
"""The state directory could not be written (read-only, full disk): 7 is left to commands ``run`` passes on."""
EXIT_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, as shells report a command that SIGINT ended."""

FAILURE_EXIT_CODES = (
    "2 bad input (including an unknown kind or tier, a kind the backend does not run, a --strict refusal, "
    "a corrupt record and an unsafe state directory); 3 timeout; 4 not found (a local cluster is created only by "
    "`ddlscale local up` or --create); 5 unauthorized; 6 backend unavailable (or, with --fail-on-fault, a cluster fault during "
    "the command); 8 state directory not writable (read only or full disk); 130 interrupted (Ctrl-C); "
    "1 other errors (including a change interrupted half-way)."
)
"""The exit codes of failures, for ``--help`` texts."""
EXIT_CODES_HELP = f"Exit codes: 0 ok; {FAILURE_EXIT_CODES}"

_EXIT_CODES = (
    # Classes whose exit code is not their family's, first: a --strict refusal is the caller's request
    # (bad input) though the cluster's maximum refuses it; a missing cluster, a fault during the
    # command, unwritable records and a never reached backend keep the codes they had before families.
    ((CapacityExceededError,), EXIT_BAD_INPUT),
    ((ClusterNotFoundError,), EXIT_NOT_FOUND),
    ((ClusterFaultError, NeverReachedError), EXIT_UNAVAILABLE),
    ((StateWriteError,), EXIT_STATE_UNWRITABLE),
    # Then the families (docs/errors.md); the rest of the cluster's state family is EXIT_OTHER.
    ((InvalidInputError,), EXIT_BAD_INPUT),
    ((ScalingTimeoutError,), EXIT_TIMEOUT),
    ((AccessError,), EXIT_UNAUTHORIZED),
    ((TransientError,), EXIT_UNAVAILABLE),
)


def exit_code_for(error: ScalingError) -> int:
    """The documented exit code of ``error`` (1 for scaling errors without a specific code)."""
    for types, code in _EXIT_CODES:
        if isinstance(error, types):
            return code
    return EXIT_OTHER


@dataclasses.dataclass
class Confirmed:
    """A state or scale result with the readiness that was confirmed after it."""

    value: Any
    readiness: Readiness

    def as_dict(self) -> Any:
        """The value's JSON with ``ready_workers`` from the readiness check and a ``readiness`` key."""
        data = to_jsonable(self.value)
        state = data.get("final", data)
        if self.readiness.ready_workers is not None:
            state["ready_workers"] = self.readiness.ready_workers
        data["readiness"] = self.readiness.proof
        return data


@dataclasses.dataclass
class WithClaims:
    """A state (or confirmed state) with the live claims on the cluster, as ``status`` prints it."""

    value: Any
    claims: Dict[str, Claim]

    def as_dict(self) -> Any:
        """The value's JSON with a ``claims`` list: id, workers, tier, holder, age and last renewal in seconds."""
        data = to_jsonable(self.value)
        now = utcnow()
        data["claims"] = [
            {
                "claim_id": claim.claim_id, "replicas": claim.replicas, "worker_hw_tier": claim.worker_hw_tier,
                "holder": claim.holder, "age_seconds": round(age_seconds(claim, now), 1),
                "renewed_seconds_ago": round((now - datetime.datetime.fromisoformat(claim.renewed_at)).total_seconds(), 1),
                "lease_seconds": claim.lease_seconds,
            }
            for claim in sorted(self.claims.values(), key=lambda c: c.created_at)
        ]
        return data


def _claims_text(claims: Dict[str, Claim]) -> str:
    if not claims:
        return "  claims: none"
    now = utcnow()
    lines = ["  claims:"]
    for claim in sorted(claims.values(), key=lambda c: c.created_at):
        tier = f" of tier {claim.worker_hw_tier}" if claim.worker_hw_tier else ""
        renewed = (now - datetime.datetime.fromisoformat(claim.renewed_at)).total_seconds()
        lines.append(
            f"    {claim.claim_id}: at least {plural(claim.replicas, 'worker')}{tier}, holder {claim.holder}, "
            f"age {age_seconds(claim, now):.0f}s, renewed {renewed:.0f}s ago (lease {claim.lease_seconds:g}s)"
        )
    return "\n".join(lines)


def to_jsonable(value: Any) -> Any:
    """``value`` with dataclasses as dicts and datetimes as ISO-8601 strings."""
    if isinstance(value, (Confirmed, WithClaims)):
        return value.as_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return value


def _text(value: Any) -> str:
    if isinstance(value, WithClaims):
        return f"{_text(value.value)}\n{_claims_text(value.claims)}"
    if isinstance(value, Confirmed):
        return f"{_text(value.value)}\n  ready:  {value.readiness.proof}"
    if isinstance(value, ClusterState):
        return value.describe()
    if isinstance(value, ScaleResult):
        capped = " (capped by maxReplicas)" if value.capped else ""
        tier = f" tier={value.worker_hw_tier}" if value.worker_hw_tier else ""
        waited = f", waited {value.seconds_waited:.1f}s" if value.waited else ", not waited"
        return (
            f"{value.cluster}: requested {value.requested}, set {value.effective}{capped}{tier}{waited}\n"
            f"  before: {value.previous.describe()}\n  after:  {value.final.describe()}"
        )
    if isinstance(value, RestartResult):
        ready = "Ready" if value.ready else "not awaited"
        return f"{value.cluster}: head pod {value.pod} restarted at {value.started_at}, {ready}\n  {value.final.describe()}"
    if isinstance(value, Baseline):
        return f"{value.cluster}: baseline {plural(value.replicas, 'worker')}, recorded {value.recorded_at.isoformat()}"
    return str(value)


def emit(value: Any, as_json: bool) -> None:
    """Print a result to stdout, as JSON or as text."""
    text = json.dumps(to_jsonable(value), indent=2, sort_keys=True) if as_json else _text(value)
    click.echo(redact(text))


def emit_error(error: ScalingError, as_json: bool) -> int:
    """Print ``error`` (JSON on stdout with ``--json``, else text on stderr); return its exit code."""
    code = exit_code_for(error)
    if as_json:
        payload = {
            "error": error.code,
            "message": error.message,
            "exit_code": code,
            "cluster": error.cluster,
            "http_status": error.status_code,
            "state": to_jsonable(error.state) if error.state is not None else None,
            "left_in_place": error.left_in_place,
            "remedy_command": error.remedy_command,
            "remedy_call": error.remedy_call,
        }
        click.echo(redact(json.dumps(payload, indent=2, sort_keys=True)))
    else:
        click.echo(redact(f"Error: {error}"), err=True)
    return code
