"""Checks every operation runs on its arguments before anything is sent: each failure is an
:class:`InvalidInputError` naming the field and the values it accepts."""
import contextlib
import datetime
import difflib
import math
import re
from typing import Callable, Dict, Optional, Pattern, Sequence
from urllib.parse import urlsplit

from ..errors import InvalidInputError
from .redaction import mask_userinfo, register_secret

MAX_REPLICAS = 1000
"""Upper bound on a requested worker count; above it is almost surely a typo."""


def closest_choice(value: object, choices: Sequence[str]) -> Optional[str]:
    """The allowed value ``value`` most likely mistypes (``'daks'`` -> ``'dask'``, compared without
    case), or None when none is close: what an error for a refused name suggests."""
    if not isinstance(value, str) or not value.strip():
        return None
    by_key = {choice.lower(): choice for choice in choices}
    found = difflib.get_close_matches(value.strip().lower(), list(by_key), n=1, cutoff=0.6)
    return by_key[found[0]] if found else None


def closest_reason(value: object, choices: Sequence[str]) -> Optional[str]:
    """``closest allowed value: 'dask'`` for an :class:`InvalidInputError`'s ``reason``, or None."""
    best = closest_choice(value, choices)
    return None if best is None else f"closest allowed value: {best!r}"


def validate_replicas(value: object, field: str = "replicas", maximum: int = MAX_REPLICAS) -> int:
    """Return ``value`` as a worker count in ``0..maximum``; booleans and floats are refused."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise InvalidInputError(field, value, f"an integer from 0 to {maximum}")
    return value


def replicas_or_minus_one(meaning: str) -> Callable[[object], int]:
    """The check of a worker count that may also be ``-1``, which means ``meaning`` (e.g. "the desired count")."""

    def check(value: object) -> int:
        if value == -1 and not isinstance(value, bool):
            return -1
        try:
            return validate_replicas(value)
        except InvalidInputError:
            raise InvalidInputError("replicas", value, f"-1 ({meaning}) or an integer from 0 to {MAX_REPLICAS}") from None

    return check


MAX_NODE_TIMEOUT = 24 * 3600.0
"""Longest timeout of a scaling node (24 h): the connector polls a node until then, so an endless
one would be polled forever."""


def validate_timeout(value: object, field: str = "timeout", maximum: Optional[float] = None) -> float:
    """Return ``value`` as a positive, finite number of seconds (at most ``maximum`` when given)."""
    allowed = "a positive number of seconds" + (f" up to {maximum:.0f} ({maximum / 3600:g} h)" if maximum else "")
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not number or not math.isfinite(value) or value <= 0 or (maximum is not None and value > maximum):
        raise InvalidInputError(field, value, allowed)
    return float(value)


def validate_tier_name(value: Optional[object], field: str = "worker_hw_tier") -> Optional[str]:
    """Return a stripped tier name, or None when no tier was asked for; empty is refused."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(field, value, "a non-empty hardware tier name, or None")
    return value.strip()


CLAIM_ID_PATTERN = re.compile(r"\w[\w.:@-]{0,199}")
"""A claim id: a word character, then up to 199 word characters, ``.``, ``:``, ``@`` or ``-`` (a phase's
label, such as a task function's name, and a random suffix); no spaces or control characters."""


def validate_claim_id(claim_id: object, field: str = "claim_id") -> str:
    """Return ``claim_id`` if it matches :data:`CLAIM_ID_PATTERN`, else raise :class:`InvalidInputError`."""
    return validate_text(
        claim_id, field, "a phase name: letters, digits, _ . : @ - (at most 200, no spaces)", CLAIM_ID_PATTERN
    )


def validate_int(value: object, field: str, minimum: int, maximum: Optional[int] = None) -> int:
    """Return ``value`` as an integer in ``minimum..maximum`` (no upper bound for None); booleans,
    floats and strings are refused."""
    allowed = f"an integer from {minimum} to {maximum}" if maximum is not None else f"an integer of at least {minimum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(field, value, allowed)
    if value < minimum or (maximum is not None and value > maximum):
        raise InvalidInputError(field, value, allowed)
    return value


def validate_text(value: object, field: str, allowed: str, pattern: Optional[Pattern[str]] = None) -> str:
    """Return ``value`` if it is a non-empty string that ``pattern`` (if given) matches as a whole."""
    if not isinstance(value, str) or not value or (pattern is not None and not pattern.fullmatch(value)):
        raise InvalidInputError(field, value, allowed)
    return value


def validate_timestamp(value: object, field: str) -> datetime.datetime:
    """Return the ISO-8601 time ``value`` as a datetime."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return datetime.datetime.fromisoformat(value)
    raise InvalidInputError(field, value, "an ISO-8601 time, e.g. 2026-01-31T12:00:00+00:00")


def validate_bool(value: object, field: str) -> bool:
    """``value`` when it is True or False (not 1, "yes" or None)."""
    if not isinstance(value, bool):
        raise InvalidInputError(field, value, "True or False")
    return value


BUILTIN_BACKENDS: Dict[str, str] = {
    "scaler": "flytekitplugins_ddlscale.backends.scaler:ScalerServiceBackend",
    "kubernetes": "flytekitplugins_ddlscale.backends.kubernetes:KubernetesBackend",
    "local": "flytekitplugins_ddlscale.backends.local:LocalBackend",
}
"""The one registry of the backends shipped with the package (name -> ``module:Class``, imported only when
chosen); others register under the ``flytekitplugins_ddlscale.backends`` entry-point group. Help, settings
and errors list backends from it."""
ALIASES = {"k8s": "kubernetes", "scaler-service": "scaler", "service": "scaler"}
"""Other names of the built-in backends."""
BACKEND_NAMES = f"{', '.join(BUILTIN_BACKENDS)} (aliases {', '.join(ALIASES)}) or an entry-point backend"
"""The backend names accepted, as help and errors list them."""


def validate_backend_name(value: Optional[str], field: str = "backend") -> Optional[str]:
    """A backend name, stripped and lower-cased (``Local`` is ``local``), or None for the environment's choice."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(field, value, f"{BACKEND_NAMES}, or None")
    return value.strip().lower()


MAX_URL_LENGTH = 2048
"""Longest ``framework_url``: it is echoed in resource metadata and messages."""
_HOST_RE = re.compile(r"(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*\.?|\[?[0-9a-f:.]+\]?")
"""A host urllib can send to: an ASCII DNS name (urlsplit lower-cases it) or an IPv4/IPv6 address."""


def validate_url(value: object, field: str = "framework_url") -> Optional[str]:
    """``value`` as a base URL without a trailing slash (None stays None); an :class:`InvalidInputError` naming
    ``field`` for anything but ``http(s)://host[:port]``, or a URL carrying ``user:password@`` (shown masked)."""
    if value is None:
        return None
    allowed = "an http:// or https:// URL of the cluster head's dashboard or web UI (e.g. http://host:8787), or None"
    if not isinstance(value, str):
        raise InvalidInputError(field, value, allowed)
    parts = urlsplit(value.strip())
    if "@" in parts.netloc:
        # Refused rather than sent: the URL travels in task templates, resource metadata and
        # messages, and urllib would hand "user:password@host" to the resolver as a host name.
        if parts.password:
            register_secret(parts.password)
        raise InvalidInputError(
            field, mask_userinfo(value.strip()), allowed,
            reason="credentials in the URL (user:password@) are not accepted: the framework check sends "
            "no credentials; give the head's URL without them, or switch the framework check off",
        )
    if len(value) > MAX_URL_LENGTH:
        raise InvalidInputError(field, value, allowed, reason=f"{len(value)} characters (at most {MAX_URL_LENGTH})")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInputError(field, value, allowed)
    if not _HOST_RE.fullmatch(parts.hostname) or len(parts.hostname) > 253:
        # urllib would hand the name to the IDNA codec (labels over 63 characters) or encode a
        # non-ASCII one as latin-1, and fail there; a look-alike letter is refused here instead.
        raise InvalidInputError(
            field, value, allowed,
            reason="the host must be an IP address or an ASCII DNS name (labels of 1-63 letters, digits or '-', "
            "at most 253 characters)",
        )
    try:
        parts.port
    except ValueError:
        raise InvalidInputError(field, value, allowed) from None
    return value.strip().rstrip("/")
