"""Cleanup of ``@distributed_phase`` on the Kubernetes backend, where the baseline and claims live
in annotations on the cluster object (so any process can restore).

The backend is chosen as in a real pod: ``DDLSCALE_BACKEND=kubernetes`` and a
kubeconfig pointing at the Kubernetes test API server.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest
from click.testing import CliRunner
from flytekit import task, workflow

from flytekitplugins_ddlscale import ClusterRef, distributed_phase
from flytekitplugins_ddlscale.phase import cluster_phase
from flytekitplugins_ddlscale._core.records import BASELINE_ANNOTATION, CLAIMS_ANNOTATION

NAME = "ray-k8s-phase"
REF = ClusterRef("ray", NAME)
AUTOSCALING = {"minReplicas": 1, "maxReplicas": 6}
CHILD = Path(__file__).with_name("rel_phase_child.py")
START_TIMEOUT = 60.0


class BodyFailed(RuntimeError):
    """The error a phase body raises on purpose."""


@task
@distributed_phase(cluster=f"ray/{NAME}", replicas=4, timeout=20, framework_ready=False)
def k8s_failing_body(x: int) -> int:
    if x >= 0:
        raise BodyFailed(f"k8s body failed with x={x}")
    return x


@task
@distributed_phase(cluster=f"ray/{NAME}", replicas=2, timeout=20, framework_ready=False)
def k8s_two_worker_body(x: int) -> int:
    return x


@workflow
def k8s_failing_wf(x: int) -> int:
    return k8s_failing_body(x=x)


@workflow
def k8s_two_worker_wf(x: int) -> int:
    return k8s_two_worker_body(x=x)


@pytest.fixture
def cluster(k8s_server: Any, k8s_env: Path) -> ClusterRef:
    k8s_server.add_cluster("ray", NAME, replicas=1, autoscaling=dict(AUTOSCALING))
    k8s_server.clear_log()
    return REF


@pytest.fixture
def children() -> Iterator[List[subprocess.Popen]]:
    started: List[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def replica_patches(server: Any) -> List[int]:
    """``spec.worker.replicas`` of every applied PATCH that set it, in order."""
    return [
        r.body["spec"]["worker"]["replicas"]
        for r in server.requests
        if r.method == "PATCH" and r.status == 200 and isinstance(r.body, dict)
        and "replicas" in ((r.body.get("spec") or {}).get("worker") or {})
    ]


def annotations(server: Any) -> dict:
    return server.get_object("ray", NAME)["metadata"].get("annotations") or {}


def assert_restored(server: Any) -> None:
    obj = server.get_object("ray", NAME)
    assert obj["spec"]["worker"]["replicas"] == 1
    assert obj["spec"]["autoscaling"] == AUTOSCALING
    assert BASELINE_ANNOTATION not in (obj["metadata"].get("annotations") or {})


def test_k8s_body_that_raises_restores_once(k8s_server, cluster):
    with pytest.raises(Exception) as caught:
        k8s_failing_wf(x=5)
    assert "k8s body failed with x=5" in str(caught.value)
    assert replica_patches(k8s_server) == [4, 1]
    assert_restored(k8s_server)
    assert CLAIMS_ANNOTATION not in annotations(k8s_server)


@pytest.mark.slow
def test_k8s_sigterm_mid_phase_restores_once(k8s_server, cluster, children, tmp_path):
    marker = tmp_path / "k8s-term.marker"
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), f"ray/{NAME}", "4", str(marker)],
        env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    children.append(proc)
    wait_for_marker(proc, marker)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=30)[0]
    assert replica_patches(k8s_server) == [4, 1], output
    assert_restored(k8s_server)


@pytest.mark.slow
def test_k8s_sigkill_then_ddlscale_restore_from_another_process(k8s_server, cluster, children, tmp_path):
    from flytekitplugins_ddlscale.cli import main

    marker = tmp_path / "k8s-kill.marker"
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), f"ray/{NAME}", "4", str(marker)],
        env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    children.append(proc)
    wait_for_marker(proc, marker)
    proc.kill()
    proc.communicate(timeout=30)
    obj = k8s_server.get_object("ray", NAME)
    assert obj["spec"]["worker"]["replicas"] == 4 and obj["spec"]["autoscaling"]["minReplicas"] == 4
    assert BASELINE_ANNOTATION in annotations(k8s_server)

    result = CliRunner().invoke(main, ["restore", "--kind", "ray", "--name", NAME, "--timeout", "20"])
    assert result.exit_code == 0, result.output
    assert_restored(k8s_server)
    assert replica_patches(k8s_server) == [4, 1]

    # The dead process's claim must not inflate the next phase.
    k8s_server.clear_log()
    k8s_two_worker_wf(x=1)
    assert replica_patches(k8s_server) == [2, 1]
    assert_restored(k8s_server)


def test_k8s_concurrent_phases_in_threads_never_shrink_each_other(k8s_server, cluster):
    a_in, b_in, a_may_end, b_may_end = (threading.Event() for _ in range(4))
    errors: List[BaseException] = []
    sizes_while_b: List[int] = []

    def run(replicas: int, entered: threading.Event, may_end: threading.Event) -> None:
        try:
            with cluster_phase(f"ray/{NAME}", replicas, timeout=20, framework_ready=False, deck=False):
                entered.set()
                may_end.wait(30)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
            entered.set()

    a = threading.Thread(target=run, args=(3, a_in, a_may_end), name="phase-a")
    b = threading.Thread(target=run, args=(2, b_in, b_may_end), name="phase-b")
    a.start()
    assert a_in.wait(30)
    b.start()
    assert b_in.wait(30)
    before_a_ends = len(replica_patches(k8s_server))
    a_may_end.set()
    a.join(30)
    sizes_while_b += replica_patches(k8s_server)[before_a_ends:]
    assert k8s_server.get_object("ray", NAME)["spec"]["worker"]["replicas"] == 2
    assert k8s_server.ready_workers(NAME) >= 2
    b_may_end.set()
    b.join(30)
    assert not errors, errors
    assert sizes_while_b and min(sizes_while_b) >= 2, sizes_while_b
    assert replica_patches(k8s_server)[-1] == 1
    assert_restored(k8s_server)
    assert CLAIMS_ANNOTATION not in annotations(k8s_server)


def wait_for_marker(proc: subprocess.Popen, marker: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"child ended before its phase body ran:\n{proc.communicate()[0]}")
        if time.monotonic() > deadline:
            pytest.fail(f"child's phase body did not start within {START_TIMEOUT:.0f}s")
        time.sleep(0.05)


def test_k8s_phase_restoring_to_zero_keeps_the_autoscaling_section_for_later(k8s_server, cluster, make_k8s):
    from flytekitplugins_ddlscale import ReplicaSpec

    with cluster_phase(f"ray/{NAME}", 3, restore=ReplicaSpec(0), timeout=20, framework_ready=False, deck=False):
        pass
    obj = k8s_server.get_object("ray", NAME)
    assert obj["spec"]["worker"]["replicas"] == 0
    make_k8s().scale(REF, 2, wait=True, timeout=20)
    assert k8s_server.get_object("ray", NAME)["spec"].get("autoscaling") == {"minReplicas": 2, "maxReplicas": 6}
