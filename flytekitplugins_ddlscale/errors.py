"""Typed errors: what went wrong, in terms a caller can branch on. Every error carries a stable ``code``, a
``message`` with credentials masked, the HTTP status and the last cluster state known, and belongs to one of five
families a caller catches (as httpx callers catch ``TransportError``): :class:`InvalidInputError`,
:class:`ClusterStateError`, :class:`TransientError`, :class:`ScalingTimeoutError`, :class:`AccessError`.
docs/errors.md lists every class."""
import errno
from typing import TYPE_CHECKING, Any, Optional

from ._core.redaction import redact

if TYPE_CHECKING:
    from .models import ClusterState


class ScalingError(Exception):
    """Base class of every error this plugin raises on purpose."""

    code = "scaling_error"
    left_in_place: Optional[str] = None
    """After a change whose wait failed: the setting the change left in place, e.g. ``spec.worker.replicas=8``."""
    remedy_command: Optional[str] = None
    """After a change whose wait failed: the ``ddlscale`` command that undoes it (or awaits a restore)."""
    remedy_call: Optional[str] = None
    """The Python call doing the same as :attr:`remedy_command`."""
    wait_message: Optional[str] = None
    """After a change whose wait failed: the message before what was left in place was added to it."""

    def __init__(
        self, message: str, *, code: Optional[str] = None, status_code: Optional[int] = None,
        cluster: Optional[str] = None, state: "Optional[ClusterState]" = None,
    ) -> None:
        self.message = redact(message)
        if code is not None:
            self.code = code
        self.status_code = status_code
        self.cluster = cluster
        self.state = state
        super().__init__(self.message)

    def __reduce__(self) -> Any:
        # Subclasses take different constructor arguments; rebuild from the
        # instance state so errors survive pickling (Dask, multiprocessing).
        return (_rebuild_error, (type(self), dict(self.__dict__)))

    def __str__(self) -> str:
        where = f"{self.cluster}: " if self.cluster else ""
        status = f" (HTTP {self.status_code})" if self.status_code else ""
        return f"[{self.code}] {where}{self.message}{status}"


def _rebuild_error(cls: type, state: dict) -> "ScalingError":
    error = cls.__new__(cls)
    Exception.__init__(error, state.get("message", ""))
    error.__dict__.update(state)
    return error


class ClusterStateError(ScalingError):
    """Family of refusals and failures of the cluster as it is (or of the records kept of it): it
    does not exist, cannot be scaled so, changed under us, or lost a worker or its head. Trying
    again changes nothing until the cluster does."""

    code = "cluster_state"


class TransientError(ScalingError):
    """Family of failures an outage explains: the backend could not be used for now. The only family
    worth trying again (operations safe to repeat, until their deadline)."""

    code = "transient"


class AccessError(ScalingError):
    """Family of refusals of the caller: no permission, or a backend never reached at its address.
    Not transient: the credentials, address or network need fixing."""

    code = "access"


class InvalidInputError(ScalingError, ValueError):
    """Family of bad input: an argument (or a value read back, checked as input) was rejected before
    anything was sent or changed. ``reason`` says what is wrong when "not allowed" alone would not;
    ``message`` (subclasses) replaces the message built from the field."""

    code = "invalid_input"

    def __init__(
        self, field: str, value: Any, allowed: str, *, reason: Optional[str] = None, message: Optional[str] = None,
        **context: Any,
    ) -> None:
        """``context``: the code, HTTP status, cluster and state, as :class:`ScalingError` takes them."""
        self.field = field
        self.value = value
        self.allowed = allowed
        self.reason = reason
        why = f": {reason}" if reason else ""
        if message is None:
            message = f"invalid {field}={shown_value(value)}{why}; allowed: {allowed}"
        super().__init__(message, **context)


_SHOWN_VALUE = 200
"""Characters of a rejected value quoted in an error: input and records come from outside, and a
message travels in logs and in a connector's answers (FlytePropeller stores them), so a value of a
million characters is named by its length instead."""


def shown_value(value: Any) -> str:
    """``repr(value)`` as an error quotes it: at most :data:`_SHOWN_VALUE` characters, then its length;
    a value too deeply nested to print is named by its type."""
    try:
        shown = repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deeply to show>"
    if len(shown) > _SHOWN_VALUE:
        return f"{shown[:_SHOWN_VALUE]}... ({len(shown)} characters)"
    return shown


class CorruptRecordError(InvalidInputError):
    """A stored record (a local cluster's ``cluster.json``, a baseline or claim) holds a value that
    user input could not: nothing is started, stopped or sent on it. ``source`` names the file (or
    annotation); ``remedy`` says what to do when the record's owner knows better than "fix or remove"."""

    code = "corrupt_record"

    def __init__(self, source: str, field: str, value: Any, allowed: str, remedy: Optional[str] = None) -> None:
        self.source = source
        remedy = remedy or "fix or remove the record (a removed record forgets that cluster's baseline or processes)"
        message = f"corrupt record {source}: {field}={shown_value(value)}; allowed: {allowed}. Nothing was changed; "
        super().__init__(field, value, allowed, message=message + remedy)


class UnsafePathError(InvalidInputError):
    """A state folder or file another user could steer: owned by someone else, writable by group or
    others, or a symbolic link. ``path`` names it; the message says the remedy."""

    code = "unsafe_state_dir"

    def __init__(self, path: Any, problem: str, remedy: str) -> None:
        self.path = str(path)
        allowed = "a folder owned by you, not writable by group or others, reached without symbolic links"
        message = f"refusing {self.path}: {problem}; {remedy}"
        super().__init__("state_dir", self.path, allowed, reason=problem, message=message)


class StateWriteError(ClusterStateError):
    """A file of the state directory could not be written (read-only folder, full disk, no
    permission): ``path`` names it; the message says the remedy. Whatever the failed write was to
    record was undone first (a process it would have recorded was stopped)."""

    code = "state_unwritable"

    def __init__(self, path: Any, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        ScalingError.__init__(
            self,
            f"could not write {self.path}: {problem}; make its folder writable and free some disk space, "
            f"then run the command again (`ddlscale local down` stops a local cluster's processes whatever "
            f"its records say)",
        )

    @classmethod
    def from_os_error(cls, path: Any, exc: OSError) -> "StateWriteError":
        """The error for ``exc``, raised writing ``path``, in words (full disk, read-only, permission)."""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return cls(path, "no space left on the device (disk or quota full)")
        if exc.errno == errno.EROFS:
            return cls(path, "the file system is read-only")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return cls(path, "permission denied (the folder is not writable)")
        return cls(path, exc.strerror or type(exc).__name__)


class UnreachableWaitError(InvalidInputError):
    """A wait for more workers than the cluster will ever have (above its desired count or its maximum),
    raised when the wait starts instead of running out its timeout."""

    code = "unreachable_wait"

    def __init__(
        self,
        replicas: int,
        *,
        desired: int,
        maximum: Optional[int],
        desired_name: str = "spec.worker.replicas",
        maximum_name: str = "maxReplicas",
        **context: Any,
    ) -> None:
        self.desired = desired
        self.maximum = maximum
        self.limit = desired if maximum is None else min(desired, maximum)
        """The most workers a wait can count on: the desired count, or the maximum when lower."""
        bound = f"{maximum_name}={maximum}" if maximum is not None else f"no {maximum_name}"
        message = (
            f"invalid replicas={replicas}: that many workers can never come ({desired_name}={desired} "
            f"desired, {bound}), so the wait would only run out its timeout; allowed: 0..{self.limit}. "
            f"Scale the cluster first (ScaleCluster, `ddlscale scale`, backend.scale)"
        )
        super().__init__("replicas", replicas, f"0..{self.limit}", message=message, **context)


class UnknownTierError(InvalidInputError):
    """A hardware tier name is unknown, empty, or restricted to other cluster kinds: ``field`` names the
    tier argument, ``value`` the name and ``allowed`` the tiers, where the catalog said (a service may not)."""

    code = "invalid_hw_tier"

    def __init__(
        self, message: str, *, field: str = "hw_tier", value: Any = None, allowed: str = "a tier of the catalog",
        **context: Any,
    ) -> None:
        super().__init__(field, value, allowed, message=message, **context)


class NotScalableError(ClusterStateError):
    """The cluster cannot be scaled as asked (no autoscaling section, bad autoscaling)."""

    code = "not_scalable"


class CapacityExceededError(ClusterStateError):
    """Strict mode: the request is above the cluster's ``maxReplicas``."""

    code = "capacity_exceeded"


class UnauthorizedError(AccessError):
    """The caller may not see or change this cluster (HTTP 401/403, RBAC, owner label)."""

    code = "unauthorized"


class ClusterNotFoundError(ClusterStateError):
    """The cluster (or its head pod) does not exist."""

    code = "not_found"
    pending = False
    """True when the cluster exists and only the object holding its size is missing (its operator has not
    created it yet): :attr:`state` is then the cluster's Pending state, and a wait for workers goes on."""


class UnsupportedOperationError(ClusterStateError):
    """The backend cannot do this for this kind (MPI head restart, service defects)."""

    code = "unsupported"


class ConflictError(ClusterStateError):
    """A concurrent writer changed the cluster and re-applying did not settle it."""

    code = "conflict"


class InterruptedChangeError(ConflictError):
    """A change was interrupted half-way (its process killed) and left its record half-written:
    nothing is started or stopped on that record (a repair would act on a size nobody asked for).
    ``path`` names the record; the message says what was being done and the remedy."""

    code = "interrupted_change"

    def __init__(self, message: str, *, path: Any, cluster: Optional[str] = None) -> None:
        self.path = str(path)
        super().__init__(message, cluster=cluster)


class UnconfirmedChangeError(ConflictError):
    """A change that is not safe to repeat (a head restart) may have been sent, but the backend
    stalled or went away before confirming it: it is not sent again; check the cluster before
    asking for it once more."""

    code = "unconfirmed_change"


class BackendUnavailableError(TransientError):
    """The backend could not be reached, or kept failing, after bounded retries."""

    code = "backend_unavailable"


class NeverReachedError(AccessError):
    """The backend has not answered once since this process's clients of it were made: the address,
    name, port, TLS settings or network are more likely wrong than the backend restarting, so this
    is not ridden out as an outage. Its code is the one it had as a kind of unavailability."""

    code = "backend_unavailable"


class CertificateRefusedError(AccessError):
    """The backend's TLS certificate failed verification (an unknown authority, self-signed, expired,
    another host's): nothing was sent, and trying again cannot help. Fix the certificate authority
    the client trusts (the kubeconfig's, ``verify=``) or the address."""

    code = "certificate_refused"


class ClusterFaultError(ClusterStateError):
    """The cluster lost its head or workers (or was scaled below the phase's need, or the phase's claim
    lapsed or was dropped) while a phase's body ran, and the phase was asked to fail on that
    (``fail_on_fault``) instead of repairing or reporting it."""

    code = "cluster_fault"


class WorkerFailedError(ClusterStateError):
    """A pod cannot become Ready (Unschedulable, CrashLoopBackOff, image pull)."""

    code = "pod_failed"

    def __init__(self, message: str, *, pod: str, reason: str, **kwargs: Any) -> None:
        self.pod = pod
        self.reason = reason
        super().__init__(message, **kwargs)


class ScalingTimeoutError(ScalingError):
    """Family of timeouts: a wait reached its timeout; ``state`` holds the last observed state."""

    code = "timeout"
