"""Baselines and claims as stored (annotations or files) and read back: every field read passes the checks of
user input inside :func:`reading`, so a damaged record is a :class:`CorruptRecordError` naming it, never what
decides what is started or sent. The rules on them: :mod:`.claimrules`; docs/reliability.md (Claims as leases)."""
import contextlib
import datetime
import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Collection, Dict, Iterator, Optional

from ..errors import CorruptRecordError, InvalidInputError
from .leases import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS, this_holder, this_holder_start
from ..models import Baseline, utcnow
from .validation import (
    validate_claim_id, validate_int, validate_replicas, validate_text, validate_tier_name, validate_timestamp,
)


@contextlib.contextmanager
def reading(source: str, remedy: Optional[str] = None) -> Iterator[None]:
    """Checks inside the block that fail raise :class:`CorruptRecordError` naming ``source`` (and
    ``remedy``, what to do about it, when given), as does any failure to parse or convert what was read
    (a number too large, nesting too deep, a value of the wrong type): one line, never a traceback."""
    try:
        yield
    except CorruptRecordError:
        raise
    except InvalidInputError as exc:
        raise CorruptRecordError(source, exc.field, exc.value, exc.allowed, remedy) from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
        what = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise CorruptRecordError(source, "record", what, "a record as ddlscale writes it", remedy) from None


def json_object(text: str, field: str) -> Dict[str, Any]:
    """``text`` parsed as a JSON object; :class:`InvalidInputError` naming ``field`` otherwise."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        # RecursionError: nesting deeper than the interpreter's stack (a 2 KB file can hold it).
        data = None
    if not isinstance(data, dict):
        raise InvalidInputError(field, _excerpt(text), "a JSON object as ddlscale writes it")
    return data


def mapping(value: Any, field: str) -> Dict[str, Any]:
    """``value`` if it is a JSON object (a dict), else :class:`InvalidInputError` naming ``field``."""
    if not isinstance(value, dict):
        raise InvalidInputError(field, value, "a JSON object")
    return value


def only_fields(data: Dict[str, Any], known: Collection[str], required: Collection[str], where: str) -> None:
    """Refuse a field of ``data`` not in ``known``, or a ``required`` one that is missing."""
    allowed = f"the fields {', '.join(sorted(known))}"
    for key in data:
        if key not in known:
            raise InvalidInputError(f"{where}.{key}" if where else str(key), data[key], allowed)
    for key in required:
        if key not in data:
            raise InvalidInputError(f"{where}.{key}" if where else key, None, f"present ({allowed})")


def _excerpt(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


ANNOTATION_PREFIX = "ddlscale.flyte.org"
BASELINE_ANNOTATION = f"{ANNOTATION_PREFIX}/baseline"
CLAIMS_ANNOTATION = f"{ANNOTATION_PREFIX}/claims"
OUTSIDE_ANNOTATION = f"{ANNOTATION_PREFIX}/outside-phases"
HOLDER_PATTERN = re.compile(r"[^\s:]{1,253}:[0-9]{1,10}")


def _now() -> str:
    return utcnow().isoformat()


@dataclass
class Claim:
    """One phase's need for at least ``replicas`` workers: a lease its holder renews (:mod:`.leases`)."""

    claim_id: str
    replicas: int
    worker_hw_tier: Optional[str] = None
    holder: str = field(default_factory=this_holder)
    """``host:pid`` of the process that made the claim: on this host, a claim whose holder is gone is dead."""
    created_at: str = field(default_factory=_now)
    renewed_at: str = field(default_factory=_now)
    """When the holder last renewed the claim (made it, at first)."""
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    """How long after ``renewed_at`` the claim stays live without another renewal."""
    holder_start: Optional[int] = field(default_factory=this_holder_start)
    """When the holder process started (clock ticks since boot), so a pid reused by another process
    does not hold the cluster; None where it cannot be read, or in a record written before it was kept."""

    def renewed(self) -> "Claim":
        """This claim renewed now."""
        return replace(self, renewed_at=_now())


def encode_claims(claims: Dict[str, Claim]) -> str:
    """Claims as compact JSON for an annotation or a file."""
    return json.dumps({k: asdict(v) for k, v in sorted(claims.items())}, separators=(",", ":"))


def decode_claims(text: Optional[str], source: str = CLAIMS_ANNOTATION) -> Dict[str, Claim]:
    """Claims from :func:`encode_claims` output (empty for None or ''), each field checked as user input:
    :class:`CorruptRecordError` names ``source`` (the file or annotation), the field and its value."""
    if not text:
        return {}
    with reading(source):
        data = json_object(validate_text(text, "claims", "claims as JSON text"), "claims")
        for key in data:
            validate_claim_id(key, "claims")
        return {key: _claim(key, value) for key, value in data.items()}


_CLAIM_FIELDS = tuple(f.name for f in fields(Claim))


def _claim(key: str, data: Any) -> Claim:
    where = f"claims[{key!r}]"
    only_fields(mapping(data, where), _CLAIM_FIELDS, ("claim_id", "replicas"), where)
    claim_id = validate_claim_id(data["claim_id"], f"{where}.claim_id")
    if claim_id != key:
        raise InvalidInputError(f"{where}.claim_id", claim_id, f"{key!r}, the id it is filed under")
    claim = Claim(
        claim_id=claim_id,
        replicas=validate_replicas(data["replicas"], field=f"{where}.replicas"),
        worker_hw_tier=validate_tier_name(data.get("worker_hw_tier"), field=f"{where}.worker_hw_tier"),
    )
    if "holder" in data:
        claim.holder = validate_text(data["holder"], f"{where}.holder", "host:pid of the claiming process", HOLDER_PATTERN)
    # Read before the times: a time may run ahead of now by at most the claim's own lease.
    if "lease_seconds" in data:
        claim.lease_seconds = _lease(data["lease_seconds"], f"{where}.lease_seconds")
    # A record without it (written before start times were kept) cannot prove its holder alive: its lease decides.
    claim.holder_start = _optional_count(data.get("holder_start"), f"{where}.holder_start")
    now = utcnow()
    if "created_at" in data:
        claim.created_at = _claim_time(data["created_at"], f"{where}.created_at", claim.lease_seconds, now)
    # A claim written before leases existed counts from when it was made.
    claim.renewed_at = (
        _claim_time(data["renewed_at"], f"{where}.renewed_at", claim.lease_seconds, now)
        if "renewed_at" in data else claim.created_at
    )
    return claim


def _claim_time(value: Any, field: str, lease_seconds: float, now: datetime.datetime) -> str:
    """A claim's time as UTC text, refused when it is further ahead of ``now`` than the claim's lease:
    clocks may differ by less, and a time in the future would keep a claim live past its lease."""
    text = _utc_text(value, field)
    try:
        ahead = (datetime.datetime.fromisoformat(text) - now).total_seconds()
    except OverflowError:  # past the end of time once turned to UTC
        ahead = math.inf
    if ahead > lease_seconds:
        raise InvalidInputError(
            field, value, f"an ISO-8601 time no more than the claim's lease ({lease_seconds:g}s) after now ({now.isoformat()})"
        )
    return text


def _utc_text(value: Any, field: str) -> str:
    """An ISO-8601 time as text with a time zone (UTC when the record gave none)."""
    moment = validate_timestamp(value, field)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.isoformat()


def _lease(value: Any, field: str) -> float:
    allowed = f"a number of seconds above 0, at most {MAX_LEASE_SECONDS:.0f}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(field, value, allowed)
    if not math.isfinite(value) or not 0 < value <= MAX_LEASE_SECONDS:
        raise InvalidInputError(field, value, allowed)
    return float(value)


def encode_baseline(baseline: Baseline) -> str:
    """A baseline as compact JSON."""
    data = asdict(baseline)
    data["recorded_at"] = baseline.recorded_at.isoformat()
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


_BASELINE_FIELDS = tuple(f.name for f in fields(Baseline))


def decode_baseline(text: Optional[str], source: str = BASELINE_ANNOTATION) -> Optional[Baseline]:
    """A baseline from :func:`encode_baseline` output (None for None or ''), checked as :func:`decode_claims`."""
    if not text:
        return None
    with reading(source):
        data = json_object(validate_text(text, "baseline", "a baseline as JSON text"), "baseline")
        only_fields(data, _BASELINE_FIELDS, ("cluster", "replicas", "recorded_at"), "baseline")
        return Baseline(
            cluster=validate_text(data["cluster"], "baseline.cluster", "the cluster as kind/name"),
            replicas=validate_replicas(data["replicas"], field="baseline.replicas"),
            autoscaling_min=_optional_count(data.get("autoscaling_min"), "baseline.autoscaling_min"),
            autoscaling_max=_optional_count(data.get("autoscaling_max"), "baseline.autoscaling_max"),
            worker_hw_tier=validate_tier_name(data.get("worker_hw_tier"), field="baseline.worker_hw_tier"),
            head_hw_tier=validate_tier_name(data.get("head_hw_tier"), field="baseline.head_hw_tier"),
            recorded_at=validate_timestamp(data["recorded_at"], "baseline.recorded_at"),
        )


def _optional_count(value: Any, field: str) -> Optional[int]:
    return None if value is None else validate_int(value, field, 0)
