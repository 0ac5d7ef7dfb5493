"""The session-wide real control plane of the envtest tier, as a pytest fixture.

``envtest`` (session scope, registered in ``tests/conftest.py`` so every
module shares ONE control plane) is :func:`running.start_envtest`: etcd,
kube-apiserver and kube-controller-manager, the repository's CRDs, the DCO's
admission webhook, the kubelet's part and the DCO stand-in, until the session
ends. Without ``$DDLSCALE_ENVTEST_DIR`` (or without etcd) every test using it
is skipped, saying why.
"""
import os
from pathlib import Path
from typing import Iterator

import pytest

from .controlplane import ENV_DIR, missing_requirements
from .running import READY_DELAY, Envtest, start_envtest

__all__ = ["READY_DELAY", "Envtest", "envtest"]


@pytest.fixture(scope="session")
def envtest() -> Iterator[Envtest]:
    """The one real control plane of the session (skipped, saying why, when it cannot run here)."""
    reasons = missing_requirements()
    if reasons:
        pytest.skip(f"envtest tier (real kube-apiserver) not run: {'; '.join(reasons)}")
    with start_envtest(Path(os.environ[ENV_DIR])) as running:
        yield running
