"""The flyte tier's real peers: FlytePropeller and Helm, built from their Go modules by build_peers.sh.

:func:`find_peers` gives the binaries, building them once per machine (into
``~/.cache/ddlscale-peers``, keyed by version; the first FlytePropeller build
takes 10-30 minutes on 2 cores) or raises :class:`MissingPeer` saying why
they cannot be had here (no Go, the module proxy refused a module): the
tier's tests are then skipped with that reason.
"""
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

SCRIPT = Path(__file__).with_name("build_peers.sh")
BUILD_TIMEOUT = 3600.0


class MissingPeer(RuntimeError):
    """A peer that cannot be built or found here; the message says why (a skip reason)."""


@dataclass(frozen=True)
class Peers:
    flytepropeller: Path
    kubectl_flyte: Path


def _build(what: str, build: bool) -> Path:
    if not build:
        done = subprocess.run(["bash", str(SCRIPT), "--built", what], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise MissingPeer(done.stderr.strip())
        return Path(done.stdout.strip())
    if shutil.which("go") is None:
        raise MissingPeer(f"no Go toolchain on PATH to build {what} (tests/flyte_tier/build_peers.sh needs Go 1.26)")
    start = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), what], capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    if done.returncode != 0:
        raise MissingPeer(f"tests/flyte_tier/build_peers.sh {what} failed ({done.returncode}): {done.stderr[-1500:]}")
    took = time.monotonic() - start
    if took > 60:
        print(f"flyte tier: built {what} in {took / 60:.1f} min")
    return Path(done.stdout.strip().splitlines()[-1])


def find_peers(build: bool = False) -> Peers:
    """FlytePropeller's two binaries (built here first if ``build``); :class:`MissingPeer` when they cannot be had."""
    folder = _build("flytepropeller", build)
    peers = Peers(folder / "flytepropeller", folder / "kubectl-flyte")
    for path in (peers.flytepropeller, peers.kubectl_flyte):
        if not os.access(path, os.X_OK):
            raise MissingPeer(f"build_peers.sh gave no executable {path}")
    return peers


def helm(build: bool = False) -> Path:
    """Helm's binary (built here first if ``build``); :class:`MissingPeer` when it cannot be had."""
    return _build("helm", build)


def peers_or_skip(more_reasons: Iterable[str] = ()) -> Peers:
    """The built peers for a tier test, or ``pytest.skip`` naming every reason the tier cannot run here (the
    envtest tier's requirements, ``more_reasons`` of the test's own, a peer not built)."""
    import pytest

    from tests.envtest.controlplane import missing_requirements

    reasons = missing_requirements() + list(more_reasons)
    try:
        found = find_peers()
    except MissingPeer as exc:
        reasons.append(str(exc))
    if reasons:
        pytest.skip(f"flyte tier (real FlytePropeller) not run: {'; '.join(reasons)}")
    return found
