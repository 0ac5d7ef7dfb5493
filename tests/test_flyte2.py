"""The Flyte 2 surface for real: flyte 2 local mode against the local backend's Dask processes."""
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

flyte = pytest.importorskip("flyte", reason="the Flyte 2 surface needs the flyte2 extra (pip install -e '.[flyte2]')")

from flytekitplugins_ddlscale.errors import InvalidInputError  # noqa: E402
from flytekitplugins_ddlscale.flyte2 import ScaleCluster, distributed_phase  # noqa: E402
from flytekitplugins_ddlscale.flyte2.report import timeline_rows  # noqa: E402
from flytekitplugins_ddlscale.models import ReplicaSpec  # noqa: E402
from flytekitplugins_ddlscale.refs import ClusterRef  # noqa: E402
from flytekitplugins_ddlscale._core.timeline import WorkerTimeline  # noqa: E402
from tests.flyte_apps import flyte2_flows as flows  # noqa: E402
from tests.flyte_support import local_backend, local_env, processes_mentioning  # noqa: E402,F401 - fixture

ROOT = Path(__file__).resolve().parent.parent
REF = ClusterRef.parse(flows.CLUSTER)
LOCAL_METADATA = Path("/tmp/flyte/metadata")
"""Where flyte 2 local mode writes a run's outputs and Reports (flyte's own choice), per run name."""


def run_locally(task, **inputs):
    """``task`` run in flyte 2 local mode under a fresh run name; (outputs, the run's Report files)."""
    name = f"ddlscale-{uuid.uuid4().hex[:12]}"
    flyte.init()  # the nodes run through flyte's local connector runner, which needs it
    try:
        outputs = flyte.with_runcontext(mode="local", name=name).run(task, **inputs).outputs()
        return outputs[0], {path: path.read_text() for path in (LOCAL_METADATA / name).rglob("report.html")}
    finally:
        import shutil

        shutil.rmtree(LOCAL_METADATA / name, ignore_errors=True)


def plugin_lines(caplog) -> str:
    """The plugin's lines of the test (under pytest, with handlers on the root logger, they are log records)."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("flytekitplugins_ddlscale"))


def existing_cluster(backend, replicas):
    """A cluster that was there before any phase: running, with no baseline recorded yet."""
    backend.up(REF, replicas, timeout=60)
    backend.restore_baseline(REF, ReplicaSpec(replicas), timeout=60)


def test_node_and_phase_arguments_are_checked_when_defined():
    env = flyte.TaskEnvironment("checks")
    with pytest.raises(InvalidInputError) as info:
        ScaleCluster("bad", env=env, cluster=flows.CLUSTER, replicas=-1)
    assert info.value.field == "replicas"
    with pytest.raises(InvalidInputError) as info:
        ScaleCluster("scale-up", env=env, cluster=flows.CLUSTER, replicas=1)
    assert info.value.field == "name"
    with pytest.raises(InvalidInputError) as info:
        ScaleCluster("scale_up", env=None, cluster=flows.CLUSTER, replicas=1)
    assert info.value.field == "env"
    with pytest.raises(InvalidInputError) as info:
        distributed_phase(cluster=flows.CLUSTER, replicas=1, lease_seconds=0)
    assert info.value.field == "lease_seconds"


def test_a_node_is_a_connector_task_of_its_environment_named_like_its_variable():
    """Serialized by flyte's own serializer (as a deployment does): the ddlscale task type, the node's
    configuration in ``custom``, and nothing a pod could run, so Flyte 2 routes it to the connector. It joins
    the flow's environment as flyte's own connector tasks do: an environment of its own (``from_task``) that
    the flow's depends on, and its template asks for no Report (the connector writes none)."""
    from flyte._internal.runtime.task_serde import get_proto_task
    from flyte.models import SerializationContext
    from google.protobuf import json_format

    from flytekitplugins_ddlscale._services.nodes.scale import ScaleConfig

    assert flows.request.name == "flyte2_flows.request" and flows.request.short_name == "request"
    node_env = flows.request.parent_env()
    assert node_env.name == "flyte2_flows-request" and node_env.tasks == {"flyte2_flows.request": flows.request}
    assert node_env in flows.env.depends_on and "flyte2_flows.request" not in flows.env.tasks
    assert node_env.image is None and flows.request.parent_env_name == node_env.name
    inputs = flows.request.native_interface.inputs
    assert list(inputs) == ["cluster", "replicas", "worker_hw_tier", "head_hw_tier"]
    assert inputs["cluster"][1] == flows.CLUSTER and inputs["replicas"][1] == 2
    assert flows.request.native_interface.outputs == {"o0": flows.ScaleOutcome}
    template = get_proto_task(flows.request, SerializationContext(version="v1", project="p", domain="d", root_dir=ROOT))
    assert template.type == "ddlscale_scale" and flows.request.cache.behavior == "disable"
    assert not template.metadata.generates_deck.value and not flows.request.report
    config = ScaleConfig.from_custom(json_format.MessageToDict(template.custom))
    assert config == ScaleConfig(cluster=flows.CLUSTER, replicas=2, wait=False, timeout=120)
    assert template.container.image == "" and list(template.container.args) == []
    assert sorted(v.key for v in template.interface.inputs.variables) == sorted(inputs)
    kinds = {flows.ready.task_type, flows.restart.task_type, flows.restore.task_type}
    assert kinds == {"ddlscale_wait", "ddlscale_restart_head", "ddlscale_restore"}


def test_the_phase_goes_below_env_task():
    env = flyte.TaskEnvironment("order")

    @env.task
    def body() -> int:
        return 1

    with pytest.raises(TypeError, match="put it below @env.task"):
        distributed_phase(cluster=flows.CLUSTER, replicas=1)(body)


def test_timeline_rows_show_each_change_and_mark_in_time_order():
    timeline = WorkerTimeline(clock=iter([0.0, 2.0]).__next__)
    timeline.add(0, seconds=0.0)
    timeline.add(2, "Small", seconds=1.0)
    timeline.add(2, "Small", seconds=2.0)
    timeline.mark("restore")
    timeline.add(0, seconds=3.5)
    assert [tuple(row) for row in timeline_rows(timeline)] == [
        ("•", "0 workers", "+0.0 s"), ("▲", "2 workers on Small", "+1.0 s"),
        ("⏵", "restore", "+2.0 s"), ("▼", "0 workers", "+3.5 s"),
    ]


@pytest.mark.slow
def test_every_node_runs_in_local_mode_with_typed_outcomes_and_summary_lines(local_env, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    outcome, reports = run_locally(flows.all_nodes, replicas=2)
    assert outcome == [
        "0->2 waited=False",
        "ready=2 2 workers registered with the Dask scheduler (local backend)",
        "head ready=True",
        "2->0 baseline",
    ]
    err = plugin_lines(caplog)
    summaries = [line for line in err.splitlines() if re.match(r"\w+: dask/flyte2-test ", line)]
    assert [line.split(":")[0] for line in summaries] == ["request", "ready", "restart", "restore"], err
    assert summaries[0] == "request: dask/flyte2-test 0 -> 2 workers requested, not waited for"
    assert summaries[3].startswith("restore: dask/flyte2-test 2 -> 0 workers (baseline) in")
    titles = sorted(t for page in reports.values()
                    for t in re.findall(r"<h3[^>]*>([^<]+: flyte2_flows\.\w+)</h3>", page))
    assert titles == ["Cluster restore: flyte2_flows.restore", "Cluster scaling: flyte2_flows.request",
                      "Cluster wait: flyte2_flows.ready", "Head restart: flyte2_flows.restart"]
    # No node asks flyte for a Report (the connector writes none on a cluster); a local run saves each node's
    # tab itself and says where.
    written = re.findall(r"^(\w+): Report written to (\S+)$", err, re.M)
    assert [label for label, _ in written] == ["request", "ready", "restart", "restore"], err
    assert all(f": flyte2_flows.{label}</h3>" in reports[Path(path)] for label, path in written)
    assert local_backend(local_env).list_clusters() == []


@pytest.mark.slow
def test_a_failing_node_fails_its_parent_and_changes_nothing(local_env):
    with pytest.raises(Exception, match="mpi"):
        run_locally(flows.unsupported_kind)
    assert local_backend(local_env).list_clusters() == []


def test_in_local_mode_a_node_runs_through_the_connector_which_refuses_a_head_tier_in_a_scale(local_env):
    """Only the connector refuses a scale node's head tier (a node run by nodes/run.py changes it): the node
    ran through flyte's local connector runner, and the refusal names the field before anything started."""
    with pytest.raises(Exception, match="invalid head_hw_tier='Large'.*put it in a RestartHead node"):
        run_locally(flows.scale_with_head_tier)
    assert local_backend(local_env).list_clusters() == []


@pytest.mark.slow
def test_a_node_in_a_local_run_without_flyte_init_fails_saying_so_before_anything_starts(local_env):
    """flyte's local connector runner needs flyte.init(); a fresh process, since init is process-wide."""
    code = ("import flyte; from tests.flyte_apps import flyte2_flows as f; "
            "flyte.with_runcontext(mode='local').run(f.all_nodes, replicas=1)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "request: a ddlscale node runs through flyte's local connector runner, which needs flyte.init() first" \
        in done.stderr, done.stderr[-3000:]
    assert local_backend(local_env).list_clusters() == []


@pytest.mark.slow
def test_sync_and_async_phases_hold_the_workers_for_the_body_and_give_back(local_env, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    outcome, reports = run_locally(flows.both_phases, fail=False)
    assert outcome == [2, 2]
    # The phases created the local cluster (no baseline), so giving back takes it down.
    assert local_backend(local_env).list_clusters() == []
    assert "DASK_SCHEDULER_SERVICE_HOST" not in os.environ
    err = plugin_lines(caplog)
    for label in ("sync_phase", "async_phase"):
        assert re.search(rf"^{label}: dask/flyte2-test 0 -> 2 workers ready in .*restored to 0 workers \(as found\)$",
                         err, re.M), err
    pages = [page for page in reports.values() if "Distributed phase: " in page]
    assert len(pages) == 2
    # A local run says where each Report is: the file of the phase's task, as flyte saved it.
    written = dict(re.findall(r"^Distributed phase: (\w+): Report written to (\S+)$", err, re.M))
    assert sorted(written) == ["async_phase", "sync_phase"], err
    assert all("Distributed phase: " in reports[Path(path)] for path in written.values())
    for page in pages:
        assert re.search(r"▲ <b>2 workers[^<]*</b> <span[^>]*>\+\d+\.\d s", page), page
        assert "<polyline" in page and "Worker-seconds by tier" in page and ">restore<" in page


@pytest.mark.slow
def test_a_failing_body_keeps_its_error_and_the_cluster_goes_back_to_its_size(local_env, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    backend = local_backend(local_env)
    existing_cluster(backend, 1)
    with pytest.raises(Exception, match="failed on purpose with 2 workers"):
        run_locally(flows.both_phases, fail=True)
    state = backend.get_state(REF)
    assert state.desired_workers == 1 and state.ready_workers == 1
    err = plugin_lines(caplog)
    assert re.search(r"^sync_phase: dask/flyte2-test 1 -> 2 workers ready in .*failed after \d+\.\d s "
                     r"\(ValueError\), restored to 1 worker \(as found\)$", err, re.M), err


@pytest.mark.slow
@pytest.mark.parametrize("task", ["sync_interrupted", "async_interrupted"])
def test_sigterm_during_the_body_gives_the_cluster_back_before_the_process_ends(local_env, tmp_path, task):
    """The sync body is blocked in a long sleep in its own thread: the relay restores from the main thread."""
    backend = local_backend(local_env)
    existing_cluster(backend, 1)
    marker = tmp_path / "body-started"
    proc = subprocess.Popen([sys.executable, "-m", "tests.flyte_apps.flyte2_flows", task, str(marker)], cwd=ROOT,
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), proc.communicate(timeout=30)
        assert marker.read_text() == "2"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM, err[-3000:]
    assert re.search(rf"^{task}: dask/flyte2-test 1 -> 2 workers ready in .*\(PhaseInterrupted\), "
                     r"restored to 1 worker \(as found\)$", err, re.M), err[-3000:]
    state = backend.get_state(REF)
    assert state.desired_workers == 1 and state.ready_workers == 1
    assert backend.claims(REF) == {}


@pytest.mark.slow
def test_ctrl_c_after_a_node_scaled_up_says_what_was_left_running_and_how_to_stop_it(local_env, tmp_path):
    """The Flyte 2 counterpart of the flytekit nodes' Ctrl-C report: nodes run in local mode, then SIGINT."""
    marker = tmp_path / "scaled"
    proc = subprocess.Popen([sys.executable, "-m", "tests.flyte_apps.flyte2_flows", "interrupted_nodes", str(marker)],
                            cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), proc.communicate(timeout=30)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "ddlscale: interrupted; left running by this flow:" in err, err[-3000:]
    assert "  dask/flyte2-test: Running, 1 worker; to stop it: ddlscale local down --name flyte2-test" in err
    state = local_backend(local_env).get_state(REF)
    assert state.desired_workers == 1  # left running, as reported (the fixture takes it down)


@pytest.fixture
def slow_scaler(tmp_path, monkeypatch):
    """The scaler test server with the slow cluster at 1 worker, selected through the environment (as in a run)."""
    from tests.flyte_support import SCALER_ENV
    from tests.servers.scaler_server import DEFAULT_API_KEY, ScalerTestServer

    kind, name = flows.SLOW_CLUSTER.split("/")
    with ScalerTestServer() as server:
        server.add_cluster(kind, name, replicas=1, max_replicas=6, min_replicas=1)
        for variable in SCALER_ENV:
            monkeypatch.delenv(variable, raising=False)
        monkeypatch.setenv("CLUSTER_SCALER_BASE_URL", server.url)
        monkeypatch.setenv("DOMINO_API_KEY", DEFAULT_API_KEY)
        monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "state"))
        yield server


def scale_requests(server, replicas):
    """The scale requests for the slow cluster asking for ``replicas`` workers, so far."""
    name = flows.SLOW_CLUSTER.split("/")[1]
    return [r for r in server.requests if r.method == "PATCH" and r.path.endswith(f"/{name}")
            and isinstance(r.body, dict) and r.body.get("replicas") == replicas]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["sync_interrupted_starting", "async_interrupted_starting"])
def test_sigterm_during_the_scale_up_gives_back_and_the_body_never_runs(slow_scaler, tmp_path, task):
    """The start runs in the body's thread (sync) or a worker thread (async): the relay interrupts it there."""
    from flytekitplugins_ddlscale.backends import get_backend

    kind, name = flows.SLOW_CLUSTER.split("/")
    # New workers appear only after 10 minutes: the phase's start is still waiting for them when the signal comes.
    slow_scaler.set_pod_ready_delay(600, kind, name)
    marker = tmp_path / "body-started"
    proc = subprocess.Popen([sys.executable, "-m", "tests.flyte_apps.flyte2_flows", task, str(marker)], cwd=ROOT,
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not scale_requests(slow_scaler, 3) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert scale_requests(slow_scaler, 3), proc.communicate(timeout=30)
        # The give-back's scale-down then completes at once (the delay applies to changes made after this).
        slow_scaler.set_pod_ready_delay(0, kind, name)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM, err[-3000:]
    assert not marker.exists()
    # No "workers ready" part: the phase never reached its size.
    assert re.search(rf"^{task}: {flows.SLOW_CLUSTER} not scaled; failed after \d+\.\d s \(PhaseInterrupted\), "
                     r"restored to 1 worker \(as found\)$", err, re.M), err[-3000:]
    assert scale_requests(slow_scaler, 1), "the cluster was not given back"
    assert slow_scaler.cluster_object(kind, name)["spec"]["worker"]["replicas"] == 1
    assert get_backend().claims(ClusterRef.parse(flows.SLOW_CLUSTER)) == {}


def test_each_node_gets_an_environment_of_its_own_that_the_flows_depends_on():
    """Through flyte's public calls (``from_task``, ``add_dependency``), under a name flyte accepts."""
    from flytekitplugins_ddlscale.flyte2.nodes import node_environment_name

    env = flyte.TaskEnvironment("own_envs")
    names = ("scale_up", "ScaleUp", "_x__y")
    nodes = [ScaleCluster(name, env=env, cluster=flows.CLUSTER, replicas=1) for name in names]
    assert [node.parent_env().name for node in nodes] == ["own_envs-scale_up", "own_envs-scaleup", "own_envs-x_y"]
    assert env.depends_on == [node.parent_env() for node in nodes] and env.tasks == {}
    assert node_environment_name("train", "_") == "train-node"
