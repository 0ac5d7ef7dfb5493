"""Cleanup of ``@distributed_phase``: the cluster never stays large after the phase ends.

A phase whose body raises, is stopped by SIGTERM (Flyte aborting the task),
or runs past its timeout restores the baseline exactly once, counted in the
scaler test server's request log. A process killed outright (SIGKILL) leaves
its baseline record behind, from which ``ddlscale restore`` recovers. Two
concurrent phases on one cluster never shrink each other.

Phases run as Flyte tasks: in this process through flytekit's local
execution, or in a child process (rel_phase_child.py) the test signals.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, List

import pytest
from click.testing import CliRunner
from flytekit import kwtypes, task, workflow
from rel_helpers import desired, scale_bodies

from flytekitplugins_ddlscale import ClusterRef, ScaleCluster, ScalingTimeoutError, distributed_phase
from flytekitplugins_ddlscale.workflow_helpers import scale_down_on_failure
from tests.servers.scaler_server import ScalerTestServer

NAME = "ray-phase"
REF = ClusterRef("ray", NAME)
BASELINE = 1
CHILD = Path(__file__).with_name("rel_phase_child.py")
START_TIMEOUT = 60.0
"""Seconds a child may take to import flytekit and scale up on this 2-core machine."""


class BodyFailed(RuntimeError):
    """The error a phase body raises on purpose."""


ON_BODY: List[Callable[[], None]] = []
"""What the test wants done while a phase body runs (e.g. inject faults into the server)."""


@task
@distributed_phase(cluster=f"ray/{NAME}", replicas=4, timeout=20, framework_ready=False)
def failing_body(x: int) -> int:
    for hook in ON_BODY:
        hook()
    if x >= 0:
        raise BodyFailed(f"body failed with x={x}")
    return x


@task
@distributed_phase(cluster=f"ray/{NAME}", replicas=4, timeout=1, framework_ready=False)
def slow_scale_up_body(x: int) -> int:
    return x


@task
@distributed_phase(cluster=f"ray/{NAME}", replicas=2, timeout=20, framework_ready=False)
def two_worker_body(x: int) -> int:
    return x


@task
@distributed_phase(
    cluster=f"ray/{NAME}", replicas=4, timeout=20, framework_ready=False, reassert_interval=0.2, sample_interval=0.1
)
def held_body(x: int) -> int:
    for hook in ON_BODY:
        hook()
    return x


@workflow
def held_wf(x: int) -> int:
    return held_body(x=x)


scale_up_node = ScaleCluster("rel_cleanup_scale_up", cluster=f"ray/{NAME}", replicas=4, timeout=20)
cleanup_on_failure = scale_down_on_failure("rel_cleanup_on_failure", cluster=f"ray/{NAME}", inputs=kwtypes(x=int), timeout=20)


@task
def failing_stage(x: int) -> int:
    if x >= 0:
        raise BodyFailed(f"stage failed with x={x}")
    return x


@workflow(on_failure=cleanup_on_failure)
def pipeline_wf(x: int) -> int:
    up = scale_up_node()
    out = failing_stage(x=x)
    up >> out
    return out


@workflow
def failing_wf(x: int) -> int:
    return failing_body(x=x)


@workflow
def slow_scale_up_wf(x: int) -> int:
    return slow_scale_up_body(x=x)


@workflow
def two_worker_wf(x: int) -> int:
    return two_worker_body(x=x)


@pytest.fixture
def cluster(scaler_server: ScalerTestServer) -> ClusterRef:
    scaler_server.add_cluster("ray", NAME, replicas=BASELINE, max_replicas=6)
    return REF


@pytest.fixture
def children() -> Iterator[List[subprocess.Popen]]:
    """Child processes started by the test; killed and reaped if the test left any."""
    started: List[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def start_child(children: List[subprocess.Popen], tmp_path: Path, tag: str, replicas: int, *extra: str) -> Path:
    """Start a phase of ``replicas`` workers in a child process; return its marker path."""
    marker = tmp_path / f"{tag}.marker"
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), f"ray/{NAME}", str(replicas), str(marker), *extra],
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    children.append(proc)
    return marker


def wait_in_body(proc: subprocess.Popen, marker: Path) -> None:
    """Block until the child's phase body runs (cluster scaled), failing if the child dies first."""
    deadline = time.monotonic() + START_TIMEOUT
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"child ended before its phase body ran:\n{proc.communicate()[0]}")
        if time.monotonic() > deadline:
            pytest.fail(f"child's phase body did not start within {START_TIMEOUT:.0f}s")
        time.sleep(0.05)


def finish(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """The child's output once it exits (within ``timeout`` seconds)."""
    return proc.communicate(timeout=timeout)[0]


def restores(server: ScalerTestServer) -> int:
    """Scale requests the server applied that set the baseline size again."""
    return scale_bodies(server, NAME).count(BASELINE)


# ----- in this process -----


def test_body_that_raises_restores_once_and_keeps_the_error(scaler_env, scaler_server, cluster, make_scaler):
    with pytest.raises(Exception) as caught:
        failing_wf(x=7)
    assert "body failed with x=7" in str(caught.value)
    assert scale_bodies(scaler_server, NAME) == [4, BASELINE]
    assert desired(scaler_server, "ray", NAME) == BASELINE
    backend = make_scaler()
    assert backend.get_baseline(REF) is None
    assert backend.records.claims(REF) == {}


def test_scale_up_past_the_phase_timeout_restores_once(scaler_env, scaler_server, cluster, make_scaler):
    scaler_server.set_pod_ready_delay(30.0)
    with pytest.raises(Exception) as caught:
        slow_scale_up_wf(x=1)
    assert "timed out" in str(caught.value)
    assert isinstance(caught.value, ScalingTimeoutError) or "ScalingTimeoutError" in repr(caught.value)
    assert scale_bodies(scaler_server, NAME) == [4, BASELINE]
    assert make_scaler().get_baseline(REF) is None


def test_restore_failure_does_not_hide_the_body_error(
    scaler_env, scaler_server, cluster, make_scaler, monkeypatch
):
    from flytekitplugins_ddlscale.cli import main

    monkeypatch.setattr(
        sys.modules[__name__], "ON_BODY",
        [lambda: scaler_server.inject_faults("status", 50, status=503, path="/scale/", method="PATCH")],
    )
    with pytest.raises(Exception) as caught:
        failing_wf(x=3)
    text = str(caught.value)
    assert "body failed with x=3" in text
    assert desired(scaler_server, "ray", NAME) == 4
    # The restore failed, so the baseline stays recorded for a later `ddlscale restore`.
    assert make_scaler().get_baseline(REF) is not None
    scaler_server.clear_faults()
    result = CliRunner().invoke(main, ["restore", "--kind", "ray", "--name", NAME, "--timeout", "20"])
    assert result.exit_code == 0, result.output
    assert desired(scaler_server, "ray", NAME) == BASELINE


def test_failed_stage_after_a_scale_up_node_is_scaled_down_by_the_failure_handler(
    scaler_env, scaler_server, cluster, make_scaler
):
    with pytest.raises(Exception) as caught:
        pipeline_wf(x=2)
    assert "stage failed with x=2" in str(caught.value)
    assert scale_bodies(scaler_server, NAME) == [4, BASELINE]
    assert desired(scaler_server, "ray", NAME) == BASELINE
    assert make_scaler().get_baseline(REF) is None


def test_autoscaler_pulling_back_mid_phase_is_reasserted(scaler_env, scaler_server, cluster):
    import httpx

    from tests.servers.scaler_server import ADMIN_API_KEY

    reasserted: List[bool] = []

    def pull_back_like_the_hpa() -> None:
        # The HPA writes spec.worker.replicas back to minReplicas; an admin scale does exactly that write.
        httpx.patch(
            f"{scaler_server.url}/ddl_cluster_scaler/scale/rayclusters/{NAME}",
            json={"replicas": BASELINE}, headers={"X-Domino-Api-Key": ADMIN_API_KEY}, timeout=5,
        ).raise_for_status()
        deadline = time.monotonic() + 10
        while desired(scaler_server, "ray", NAME) != 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        reasserted.append(desired(scaler_server, "ray", NAME) == 4)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys.modules[__name__], "ON_BODY", [pull_back_like_the_hpa])
        assert held_wf(x=1) == 1
    assert reasserted == [True]
    assert scale_bodies(scaler_server, NAME) == [4, BASELINE, 4, BASELINE]
    assert desired(scaler_server, "ray", NAME) == BASELINE


# ----- in a child process -----


@pytest.mark.slow
def test_sigterm_during_the_scale_up_wait_restores_once(scaler_env, scaler_server, cluster, children, tmp_path, make_scaler):
    scaler_server.set_pod_ready_delay(30.0)  # the phase is still waiting for its workers
    marker = start_child(children, tmp_path, "term-early", 4)
    deadline = time.monotonic() + START_TIMEOUT
    while not scale_bodies(scaler_server, NAME) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert scale_bodies(scaler_server, NAME) == [4]
    children[0].send_signal(signal.SIGTERM)
    output = finish(children[0])
    assert not marker.exists(), "the body must not run after the phase was interrupted"
    assert "PHASE-ERROR" in output, output
    assert scale_bodies(scaler_server, NAME) == [4, BASELINE], output
    assert make_scaler().get_baseline(REF) is None


@pytest.mark.slow
def test_second_sigterm_during_the_restore_does_not_cut_it_short(
    scaler_env, scaler_server, cluster, children, tmp_path, make_scaler
):
    marker = start_child(children, tmp_path, "term2", 4)
    wait_in_body(children[0], marker)
    scaler_server.set_pod_ready_delay(1.0)  # the scale-down wait now lasts a second
    children[0].send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while restores(scaler_server) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    children[0].send_signal(signal.SIGTERM)
    output = finish(children[0])
    assert scale_bodies(scaler_server, NAME) == [4, BASELINE], output
    assert make_scaler().get_baseline(REF) is None, output
    # The restore waited for the workers to leave before the process ended.
    state = make_scaler().get_state(REF)
    assert state.existing_workers == BASELINE, output


@pytest.mark.slow
def test_task_timeout_enforced_like_flyte_restores_once(
    scaler_env, scaler_server, cluster, children, tmp_path, make_scaler
):
    # flytekit's local execution does not enforce @task(timeout=...); on Flyte the pod is
    # terminated: SIGTERM, then SIGKILL after the grace period. Do exactly that here.
    task_timeout, grace = 2, 15.0
    marker = start_child(children, tmp_path, "timeout", 4, "--task-timeout", str(task_timeout))
    wait_in_body(children[0], marker)
    time.sleep(task_timeout)
    children[0].send_signal(signal.SIGTERM)
    try:
        children[0].wait(timeout=grace)
    except subprocess.TimeoutExpired:
        children[0].kill()
    output = finish(children[0])
    assert children[0].returncode != -signal.SIGKILL, f"needed SIGKILL after the grace period:\n{output}"
    assert scale_bodies(scaler_server, NAME) == [4, BASELINE], output
    assert make_scaler().get_baseline(REF) is None


@pytest.mark.slow
def test_sigkill_leaves_a_baseline_that_ddlscale_restore_recovers(
    scaler_env, scaler_server, cluster, children, tmp_path, make_scaler
):
    from flytekitplugins_ddlscale.cli import main

    marker = start_child(children, tmp_path, "kill", 4)
    wait_in_body(children[0], marker)
    children[0].kill()
    finish(children[0])
    assert desired(scaler_server, "ray", NAME) == 4
    baseline = make_scaler().get_baseline(REF)
    assert baseline is not None and baseline.replicas == BASELINE

    result = CliRunner().invoke(main, ["restore", "--kind", "ray", "--name", NAME, "--timeout", "20", "--json"])
    assert result.exit_code == 0, result.output
    assert desired(scaler_server, "ray", NAME) == BASELINE
    assert make_scaler().get_baseline(REF) is None
    assert scale_bodies(scaler_server, NAME) == [4, BASELINE]

    # The dead process's claim must not inflate the next phase.
    scaler_server.clear_requests()
    two_worker_wf(x=1)
    assert scale_bodies(scaler_server, NAME) == [2, BASELINE]
    assert desired(scaler_server, "ray", NAME) == BASELINE


@pytest.mark.slow
@pytest.mark.parametrize("first, second", [(3, 2), (2, 3)], ids=["larger-first", "smaller-first"])
def test_concurrent_phases_never_shrink_each_other(
    scaler_env, scaler_server, cluster, children, tmp_path, first, second
):
    marker_a = tmp_path / "a.marker"
    marker_b = start_child(children, tmp_path, "b", second, "--after", str(marker_a))
    start_child(children, tmp_path, "a", first)
    proc_b, proc_a = children
    wait_in_body(proc_a, marker_a)
    before_b = len(scale_bodies(scaler_server, NAME))
    wait_in_body(proc_b, marker_b)
    assert desired(scaler_server, "ray", NAME) == max(first, second)

    marker_a.with_suffix(".release").touch()
    output_a = finish(proc_a)
    assert "PHASE-OK" in output_a, output_a
    # B still runs: the cluster must be at least what B needs.
    assert desired(scaler_server, "ray", NAME) == second

    marker_b.with_suffix(".release").touch()
    output_b = finish(proc_b)
    assert "PHASE-OK" in output_b, output_b
    applied = scale_bodies(scaler_server, NAME)
    assert applied[-1] == BASELINE and applied.count(BASELINE) == 1, applied
    assert all(size >= first for size in applied[:before_b]), applied
    assert all(size >= second for size in applied[before_b:-1]), applied
    assert desired(scaler_server, "ray", NAME) == BASELINE
