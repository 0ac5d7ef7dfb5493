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
from dataclasses import asdict, dataclass, field
from typing import Dict, Optional

from .models import Baseline, utcnow

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


def decode_claims(text: Optional[str]) -> Dict[str, Claim]:
    """Claims from :func:`encode_claims` output; empty for None or ''."""
    if not text:
        return {}
    return {k: Claim(**v) for k, v in json.loads(text).items()}


def encode_baseline(baseline: Baseline) -> str:
    """A baseline as compact JSON."""
    data = asdict(baseline)
    data["recorded_at"] = baseline.recorded_at.isoformat()
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def decode_baseline(text: Optional[str]) -> Optional[Baseline]:
    """A baseline from :func:`encode_baseline` output; None for None or ''."""
    if not text:
        return None
    data = json.loads(text)
    data["recorded_at"] = datetime.datetime.fromisoformat(data["recorded_at"])
    return Baseline(**data)
