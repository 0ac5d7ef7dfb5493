"""Bad input on the local backend is refused before any process starts or any state is written.

The local backend starts real ``dask scheduler``/``dask worker`` processes;
a refused call must start none (the suite's leftover check also fails the
test if one is left running) and leave the state directory empty.
"""
from pathlib import Path
from typing import Any, Callable, List

import pytest
from rel_helpers import child_pids

from flytekitplugins_ddlscale import ClusterRef, InvalidInputError, UnknownTierError
from flytekitplugins_ddlscale.errors import ScalingError, UnsupportedOperationError

REF = ClusterRef("dask", "dask-input")


@pytest.fixture
def local(clean_env: Path) -> Any:
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    backend = LocalBackend(state_dir=clean_env / "local")
    yield backend
    backend.close()


def files_under(path: Path) -> List[Path]:
    return [p for p in path.rglob("*") if p.is_file() and not p.name.endswith(".lock")]


@pytest.mark.parametrize(
    "call, error, field",
    [
        (lambda b: b.scale(REF, -1), InvalidInputError, "replicas"),
        (lambda b: b.scale(REF, 10**6), InvalidInputError, "replicas"),
        (lambda b: b.scale(REF, True), InvalidInputError, "replicas"),
        (lambda b: b.scale(REF, 2.5), InvalidInputError, "replicas"),
        (lambda b: b.scale(REF, 2, ""), InvalidInputError, "worker_hw_tier"),
        (lambda b: b.scale(REF, 2, "Huge"), UnknownTierError, "worker_hw_tier"),
        (lambda b: b.scale(REF, 2, timeout=0), InvalidInputError, "timeout"),
        (lambda b: b.claim(REF, "phase-a", -3), InvalidInputError, "replicas"),
        (lambda b: b.restart_head(REF, timeout=-1), InvalidInputError, "timeout"),
    ],
    ids=["neg", "huge", "bool", "float", "empty-tier", "unknown-tier", "timeout0", "claim-neg", "restart-timeout"],
)
def test_local_backend_refuses_bad_input_before_starting_anything(
    local: Any, clean_env: Path, call: Callable[[Any], Any], error: type, field: str
):
    running = set(child_pids())  # the session's own children (the envtest control plane) are not the call's
    with pytest.raises(error) as caught:
        call(local)
    assert field in str(caught.value)
    if error is UnknownTierError:
        assert "Small" in str(caught.value) and "Medium" in str(caught.value)
    assert set(child_pids()) <= running
    assert files_under(clean_env) == []


@pytest.mark.parametrize("cluster", ["mpi/mpi-input", "kuberay/ray-input", "dask-operator/dask-input"])
def test_local_backend_refuses_kinds_it_cannot_run_before_starting_anything(local: Any, clean_env: Path, cluster: str):
    running = set(child_pids())
    with pytest.raises((UnsupportedOperationError, ScalingError)) as caught:
        local.scale(ClusterRef.parse(cluster), 2)
    assert "the local backend runs dask" in str(caught.value)
    assert set(child_pids()) <= running
    assert files_under(clean_env) == []
