"""Baselines and claims: the bookkeeping that lets phases share a cluster safely.

A *baseline* is the cluster's size and tiers before this plugin first changed
it. A *claim* says "phase X needs N workers until it releases". The cluster
is held at the largest live claim; when the last claim is released the
baseline is restored. Both are stored where every participant can see them:
annotations on the custom object (Kubernetes), or a :class:`FileRecordStore`
(scaler service, local backend). This module holds the format and the pure
logic; backends hold the storage.
"""
import datetime
import json
import os
import socket
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Optional

from .errors import InvalidInputError
from .models import Baseline, utcnow
from .recordcheck import json_object, mapping, only_fields, reading
from .validation import (
    validate_claim_id,
    validate_int,
    validate_replicas,
    validate_text,
    validate_tier_name,
    validate_timestamp,
)

ANNOTATION_PREFIX = "ddlscale.flyte.org"
BASELINE_ANNOTATION = f"{ANNOTATION_PREFIX}/baseline"
CLAIMS_ANNOTATION = f"{ANNOTATION_PREFIX}/claims"


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Claim:
    """One phase's need for workers."""

    claim_id: str
    replicas: int
    worker_hw_tier: Optional[str] = None
    holder: str = field(default_factory=_holder)
    """``host:pid`` of the process that made the claim, for diagnosing stale claims."""
    created_at: str = field(default_factory=lambda: utcnow().isoformat())


def largest_claim(claims: Dict[str, Claim]) -> Optional[Claim]:
    """The claim with the most replicas (ties: the oldest), or None when there are none."""
    if not claims:
        return None
    return max(claims.values(), key=lambda c: (c.replicas, _neg_time(c.created_at)))


def _neg_time(iso: str) -> float:
    return -datetime.datetime.fromisoformat(iso).timestamp()


def encode_claims(claims: Dict[str, Claim]) -> str:
    """Claims as compact JSON for an annotation or a file."""
    return json.dumps({k: asdict(v) for k, v in sorted(claims.items())}, separators=(",", ":"))


def decode_claims(text: Optional[str], source: str = CLAIMS_ANNOTATION) -> Dict[str, Claim]:
    """Claims from :func:`encode_claims` output; empty for None or ''.

    Every field is checked as user input is: :class:`CorruptRecordError`
    names ``source`` (the file or annotation), the field and its value.
    """
    if not text:
        return {}
    with reading(source):
        data = json_object(validate_text(text, "claims", "claims as JSON text"), "claims")
        return {key: _claim(key, value) for key, value in data.items()}


_CLAIM_FIELDS = tuple(f.name for f in fields(Claim))


def _claim(key: str, data: Any) -> Claim:
    where = f"claims[{key!r}]"
    only_fields(mapping(data, where), _CLAIM_FIELDS, ("claim_id", "replicas"), where)
    claim_id = validate_claim_id(data["claim_id"])
    if claim_id != key:
        raise InvalidInputError(f"{where}.claim_id", claim_id, f"{key!r}, the id it is filed under")
    claim = Claim(
        claim_id=claim_id,
        replicas=validate_replicas(data["replicas"], field=f"{where}.replicas"),
        worker_hw_tier=validate_tier_name(data.get("worker_hw_tier"), field=f"{where}.worker_hw_tier"),
    )
    if "holder" in data:
        claim.holder = validate_text(data["holder"], f"{where}.holder", "host:pid of the claiming process")
    if "created_at" in data:
        validate_timestamp(data["created_at"], f"{where}.created_at")
        claim.created_at = data["created_at"]
    return claim


def encode_baseline(baseline: Baseline) -> str:
    """A baseline as compact JSON."""
    data = asdict(baseline)
    data["recorded_at"] = baseline.recorded_at.isoformat()
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


_BASELINE_FIELDS = tuple(f.name for f in fields(Baseline))


def decode_baseline(text: Optional[str], source: str = BASELINE_ANNOTATION) -> Optional[Baseline]:
    """A baseline from :func:`encode_baseline` output; None for None or ''.

    Every field is checked as user input is: :class:`CorruptRecordError`
    names ``source`` (the file or annotation), the field and its value.
    """
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
