"""Local backend against real Ray nodes (``ray start --head`` and ``ray start`` processes).

One Ray head is started for the module (it takes 10-20 s on this machine)
and shared by the tests in the order they are written; each test first
sets the worker count it starts from. What the tests check comes from Ray
itself: the dashboard's node list (names, CPUs, memory), a real ``ray://``
client running a remote task, and the processes under /proc.
"""
import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, List

import pytest
from click.testing import CliRunner

from flytekitplugins_ddlscale import ClusterRef, ReplicaSpec, ScaleCluster, UnsupportedOperationError
from flytekitplugins_ddlscale.backends.local import LocalBackend, _procs as procs
from flytekitplugins_ddlscale.backends.local._tiers import WorkerShape
from flytekitplugins_ddlscale._core.settings import RAY_EXECUTABLE
from flytekitplugins_ddlscale.cli.local_commands import local
from flytekitplugins_ddlscale._services.readiness import FrameworkOptions, ReadinessCheck
from flytekitplugins_ddlscale._framework.endpoints import resolve_endpoint
from flytekitplugins_ddlscale._framework.wait import wait_registered
from flytekitplugins_ddlscale.phase import cluster_phase
from tests.test_framework_surfaces import POD_DELAY, cli, scaler, set_env  # noqa: F401
from tests.test_local_support import processes_mentioning, wait_dead

pytestmark = [pytest.mark.slow, pytest.mark.starts_ray]

NAME = "shared"
REF = ClusterRef("ray", NAME)
TIMEOUT = 180.0
GIB = 1024**3


def dashboard_nodes(backend: LocalBackend, ref: ClusterRef = REF) -> Dict[str, dict]:
    """ALIVE worker nodes by name, read from the dashboard by this test (not through the plugin)."""
    env = backend.connection_env(ref)
    url = f"http://127.0.0.1:{env['DDLSCALE_RAY_DASHBOARD_PORT']}/api/v0/nodes?limit=100&detail=true"
    # The head runs with token authentication; the token is in the file the variables name.
    token = Path(env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        nodes = json.loads(reply.read())["data"]["result"]["result"]
    return {n["node_name"]: n for n in nodes if n["state"] == "ALIVE" and not n["is_head_node"]}


def worker_names(backend: LocalBackend, ref: ClusterRef = REF) -> List[str]:
    return sorted(w.name for w in backend.store.load(ref).workers)


def cluster_processes(backend: LocalBackend, ref: ClusterRef) -> List[int]:
    """Every process of a local Ray cluster: its session files live under its Ray temp dir, and
    worker nodes name the head's GCS address."""
    record = backend.store.load(ref)
    found = set(processes_mentioning(record.framework["temp_dir"])) if record is not None else set()
    if record is not None and record.port:
        found |= set(processes_mentioning(f"--address {record.host}:{record.port}"))
    return sorted(found)


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """The module's DDLSCALE_STATE_DIR; its local backend holds the shared cluster."""
    return tmp_path_factory.mktemp("ray-state")


@pytest.fixture(scope="module")
def backend(state):
    """The local backend of the shared cluster; at the end, ``down`` must leave no Ray process."""
    backend = LocalBackend(state_dir=state / "local", stop_grace=5.0)
    watched = {}
    yield backend, watched
    for ref in backend.list_clusters():
        watched[ref] = cluster_processes(backend, ref)
    backend.shutdown_all()
    for ref, pids in watched.items():
        left = [pid for pid in pids if procs.start_time(pid) is not None]
        deadline = time.monotonic() + 15
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [pid for pid in left if procs.start_time(pid) is not None]
        assert left == [], f"{ref}: processes left running: {left}"


@pytest.fixture
def b(backend):
    return backend[0]


def test_without_ray_the_error_says_what_to_install(state, monkeypatch):
    monkeypatch.setenv(RAY_EXECUTABLE.name, str(state / "no-such-ray"))
    fresh = LocalBackend(state_dir=state / "no-ray")
    for call in (lambda: fresh.scale(ClusterRef("ray", "none"), 1), lambda: fresh.up(ClusterRef("ray", "none"))):
        with pytest.raises(UnsupportedOperationError) as caught:
            call()
        assert 'uv pip install -c constraints.txt -e ".[ray]"' in str(caught.value)
        assert RAY_EXECUTABLE.name in str(caught.value)
    # Refused before anything was recorded: no cluster, no baseline file.
    assert fresh.list_clusters() == [] and list((state / "no-ray").rglob("*.json")) == []


def test_scale_0_1_2_1_counts_alive_worker_nodes_of_the_tier(b):
    one = b.scale(REF, 1, timeout=TIMEOUT)
    assert one.previous.desired_workers == 0
    assert (one.final.ready_workers, one.final.existing_workers, one.final.status) == (1, 1, "Running")
    nodes = dashboard_nodes(b)
    assert sorted(nodes) == worker_names(b)
    (node,) = nodes.values()
    # The packaged Small tier: 1 core, 1Gi split between the object store and task memory.
    assert node["resources_total"]["CPU"] == 1.0
    assert node["resources_total"]["memory"] + node["resources_total"]["object_store_memory"] == pytest.approx(GIB, rel=0.01)

    reports = []
    two = b.scale(REF, 2, timeout=TIMEOUT, progress=reports.append)
    assert (two.final.ready_workers, two.final.existing_workers) == (2, 2)
    assert "2 workers seen by the Ray head of ray/shared" in reports[-1].what
    assert sorted(dashboard_nodes(b)) == worker_names(b)

    before = {w.name: w.proc for w in b.store.load(REF).workers}
    back = b.scale(REF, 1, timeout=TIMEOUT)
    assert (back.final.ready_workers, back.final.existing_workers) == (1, 1)
    (kept,) = worker_names(b)
    assert procs.is_alive(before[kept])
    gone = [proc for name, proc in before.items() if name != kept]
    assert [procs.is_alive(p) for p in gone] == [False]
    # A stopped node leaves the cluster (SIGTERM drains it), it does not linger as ALIVE.
    assert sorted(dashboard_nodes(b)) == [kept]
    assert b.get_baseline(REF).replicas == 0


def test_a_ray_client_connects_through_the_domino_variables_and_runs_on_a_worker(b):
    b.scale(REF, 1, timeout=TIMEOUT)
    script = (
        "import os, ray\n"
        "address = f\"ray://{os.environ['RAY_HEAD_SERVICE_HOST']}:{os.environ['RAY_HEAD_SERVICE_PORT']}\"\n"
        # No retry: this is the head's first client, whose per-client server used to die on its
        # first fork (see ray_ops.head_argv).
        "ray.init(address)\n"
        "@ray.remote\n"
        "def square(x):\n"
        "    return x * x, ray.get_runtime_context().get_node_id()\n"
        "results = ray.get([square.remote(x) for x in range(10)])\n"
        "print(sum(r[0] for r in results), sorted({r[1] for r in results}))\n"
        "ray.shutdown()\n"
    )
    with b.connected(REF) as env:
        assert set(env) == {
            "RAY_HEAD_SERVICE_HOST", "RAY_HEAD_SERVICE_PORT", "DDLSCALE_RAY_DASHBOARD_PORT",
            "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH",
            "RAY_USE_TLS", "RAY_TLS_CA_CERT", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY",
        }
        # The client server speaks Ray's mutual TLS only: the cluster's own authority, certificate and key.
        folder = b.store.cluster_dir(REF) / "tls"
        assert (env["RAY_USE_TLS"], env["RAY_TLS_CA_CERT"], env["RAY_TLS_SERVER_CERT"], env["RAY_TLS_SERVER_KEY"]) == (
            "1", str(folder / "ca.pem"), str(folder / "cluster.pem"), str(folder / "cluster-key.pem"))
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                              env=dict(os.environ))
    assert "RAY_HEAD_SERVICE_HOST" not in os.environ
    assert done.returncode == 0, done.stderr[-3000:]
    total, node_ids = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(total) == sum(x * x for x in range(10))
    # The head has no CPUs: every task ran on the one worker node.
    assert eval(node_ids) == [n["node_id"] for n in dashboard_nodes(b).values()]


def test_framework_check_reads_the_real_dashboard_from_the_connection_variables(b):
    state = b.scale(REF, 2, timeout=TIMEOUT).final
    endpoint = resolve_endpoint("ray", env=b.connection_env(REF))
    assert endpoint is not None
    assert endpoint.source.startswith("$RAY_HEAD_SERVICE_HOST, port ")
    with b.connected(REF):  # the token the dashboard asks for, as a phase body has it
        registered = wait_registered(endpoint, 2, timeout=30)
    assert registered.workers == 2
    assert f"2 workers registered with the Ray head at {endpoint.url}" == registered.proof
    readiness = ReadinessCheck(b, REF, FrameworkOptions()).ready(state, 2, 30)
    assert readiness.proof == "2 workers registered with the Ray head (local backend)"


@pytest.mark.parametrize("surface", ["node", "cli", "phase"])
def test_surfaces_wait_until_the_real_ray_worker_joined(surface, b, scaler, monkeypatch):
    """The scaler test server lists the pod within a second; the real Ray worker takes seconds
    longer to join the real head, and each surface returns only once the head lists it."""
    b.scale(REF, 0, timeout=TIMEOUT)
    set_env(monkeypatch, b.connection_env(REF))
    b.scale(REF, 1, wait=False)
    timeout = 150.0
    if surface == "node":
        outcome = ScaleCluster("up_ray", cluster="ray/ray-fw", replicas=1, timeout=timeout)()
        proof, ready = outcome.readiness, outcome.ready_workers
    elif surface == "cli":
        done = cli("scale", "--kind", "ray", "--name", "ray-fw", "--replicas", "1", "--timeout", str(timeout), "--json")
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        proof, ready = result["readiness"], result["final"]["ready_workers"]
    else:
        # The real worker is not the scaler test server's to remove: the phase gives back the size the real
        # head keeps listing, so the framework check after its restore (at most N registered) holds.
        with cluster_phase("ray/ray-fw", 1, restore=ReplicaSpec(1), timeout=timeout, reassert_interval=None,
                           deck=False) as phase:
            proof, ready = phase.framework_check, len(dashboard_nodes(b))
    assert len(dashboard_nodes(b)) == 1 and ready == 1
    assert b.wait_for_workers(REF, 1, timeout=10).ready_workers == 1
    dashboard = f"http://127.0.0.1:{b.connection_env(REF)['DDLSCALE_RAY_DASHBOARD_PORT']}"
    assert f"registered with the Ray head at {dashboard}" in proof


def test_a_killed_worker_node_is_replaced_and_leaves_no_process(b):
    b.scale(REF, 1, timeout=TIMEOUT)
    (victim,) = b.store.load(REF).workers
    children = procs.group_members(victim.proc)
    assert any("raylet" in Path(f"/proc/{c.pid}/cmdline").read_text(errors="replace") for c in children)
    os.kill(victim.proc.pid, signal.SIGKILL)
    wait_dead(victim.proc)
    deadline = time.monotonic() + 30
    while any(procs.is_alive(c) for c in children):
        assert time.monotonic() < deadline, "the raylet of a killed node kept running"
        time.sleep(0.2)
    assert b.get_state(REF).existing_workers == 0
    repaired = b.repair(REF, timeout=TIMEOUT)
    assert (repaired.ready_workers, repaired.existing_workers) == (1, 1)
    (replacement,) = worker_names(b)
    assert replacement != victim.name and replacement in dashboard_nodes(b)


def test_head_restart_keeps_every_port_and_the_workers_rejoin(b):
    b.scale(REF, 1, timeout=TIMEOUT)
    before = b.store.load(REF)
    old_head = procs.group_members(before.scheduler) + [before.scheduler]
    result = b.restart_head(REF, wait=True, timeout=TIMEOUT)
    after = b.store.load(REF)
    assert result.ready and result.final.ready_workers == 1
    assert (after.port, after.ports) == (before.port, before.ports)
    assert after.scheduler != before.scheduler
    assert worker_names(b) == sorted(w.name for w in before.workers)
    assert sorted(dashboard_nodes(b)) == worker_names(b)
    assert [p.pid for p in old_head if procs.is_alive(p)] == []


def test_a_killed_head_is_restarted_on_its_ports(b):
    b.scale(REF, 1, timeout=TIMEOUT)
    before = b.store.load(REF)
    os.kill(before.scheduler.pid, signal.SIGKILL)
    wait_dead(before.scheduler)
    assert b.get_state(REF).status == "Failed"
    repaired = b.repair(REF, timeout=TIMEOUT)
    after = b.store.load(REF)
    assert repaired.ready_workers == 1 and (after.port, after.ports) == (before.port, before.ports)
    assert sorted(dashboard_nodes(b)) == worker_names(b)


def test_a_tier_change_replaces_the_workers_with_nodes_of_the_new_tier(b):
    b.scale(REF, 1, worker_hw_tier="Small", timeout=TIMEOUT)
    (old,) = b.store.load(REF).workers
    result = b.scale(REF, 1, worker_hw_tier="Medium", timeout=TIMEOUT)
    assert (result.final.worker_hw_tier, result.final.ready_workers, result.final.existing_workers) == ("Medium", 1, 1)
    (new,) = b.store.load(REF).workers
    assert new.name != old.name and not procs.is_alive(old.proc)
    node = dashboard_nodes(b)[new.name]
    assert node["resources_total"]["CPU"] == 2.0
    assert node["resources_total"]["memory"] + node["resources_total"]["object_store_memory"] == pytest.approx(2 * GIB, rel=0.01)
    assert list(dashboard_nodes(b)) == [new.name]


def test_two_clusters_run_side_by_side_and_down_stops_only_its_own(b):
    other = ClusterRef("ray", "beside")
    b.scale(REF, 1, timeout=TIMEOUT)
    b.scale(other, 1, timeout=TIMEOUT)
    mine, theirs = b.store.load(REF), b.store.load(other)
    assert {mine.port, *mine.ports.values()}.isdisjoint({theirs.port, *theirs.ports.values()})
    assert len(dashboard_nodes(b, other)) == 1 and len(dashboard_nodes(b)) == 1
    pids = cluster_processes(b, other)
    assert len(pids) >= 4
    assert b.down(other) is True
    assert [pid for pid in pids if procs.start_time(pid) is not None] == []
    assert b.get_state(REF).ready_workers == 1


def test_cli_local_up_status_down_with_kind_ray(b, state):
    invoke = lambda *args: CliRunner().invoke(local, ["--state-dir", str(state), *args])  # noqa: E731
    up = invoke("up", "--kind", "ray", "--name", NAME, "--workers", "2", "--json")
    assert up.exit_code == 0, up.output
    info = json.loads(up.stdout)
    assert (info["ready_workers"], info["status"]) == (2, "Running")
    assert info["client_address"] == f"ray://127.0.0.1:{info['env']['RAY_HEAD_SERVICE_PORT']}"
    status = json.loads(invoke("status", "--kind", "ray", "--name", NAME, "--json").stdout)
    assert status["dashboard"] == f"http://127.0.0.1:{info['env']['DDLSCALE_RAY_DASHBOARD_PORT']}"
    assert len(dashboard_nodes(b)) == 2
    pids = cluster_processes(b, REF)
    ray_files = Path(b.store.load(REF).framework["temp_dir"])
    # Ray makes its folders 0777: they sit in a private folder of the cluster's.
    assert status["ray_temp_dir"] == str(ray_files / "r") and (ray_files / "r" / "session_latest").exists()
    assert stat.S_IMODE(os.lstat(ray_files).st_mode) == 0o700
    down = invoke("down", "--kind", "ray", "--name", NAME)
    assert down.exit_code == 0, down.output
    assert b.list_clusters() == []
    assert [pid for pid in pids if procs.start_time(pid) is not None] == []
    # Ray's sessions and logs (head and every worker node) went with the cluster.
    assert not ray_files.exists()


# ----- the worker node wrapper, with plain commands standing in for `ray start` -----

RAY_NODE = Path(procs.__file__).with_name("_ray_node.py")
TRAPPING = 'echo started >> "$0"; trap \'echo stopped >> "$0"; exit 0\' TERM; while :; do sleep 0.05; done'


@pytest.fixture
def head_ready(tmp_path):
    """The file a ready head's readiness check writes (the wrapper asks no server)."""
    ready = tmp_path / "ray-head-ready"
    ready.touch()
    return str(ready)


def _lines(path: Path, count: int, timeout: float = 20.0) -> List[str]:
    deadline = time.monotonic() + timeout
    while len(path.read_text().splitlines() if path.exists() else []) < count:
        assert time.monotonic() < deadline, f"{path} has fewer than {count} lines"
        time.sleep(0.05)
    return path.read_text().splitlines()


def test_node_wrapper_starts_a_failing_node_twice_more_then_reports_its_status(head_ready, tmp_path):
    runs = tmp_path / "runs"
    done = subprocess.run([sys.executable, str(RAY_NODE), head_ready, "--", "sh", "-c", 'echo run >> "$0"; exit 3', str(runs)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert runs.read_text().splitlines() == ["run", "run", "run"]
    assert "failed 0s after starting (exit status 3); starting it again (attempt 2 of 3)" in done.stderr


def test_node_wrapper_passes_sigterm_on_and_its_death_stops_the_node(head_ready, tmp_path):
    for how in (signal.SIGTERM, signal.SIGKILL):
        log = tmp_path / f"node-{how.name}"
        wrapper = subprocess.Popen([sys.executable, str(RAY_NODE), head_ready, "--", "sh", "-c", TRAPPING, str(log)])
        try:
            _lines(log, 1)
            wrapper.send_signal(how)
            assert _lines(log, 2) == ["started", "stopped"]
            assert wrapper.wait(timeout=20) == (0 if how == signal.SIGTERM else -signal.SIGKILL)
        finally:
            wrapper.kill()
            wrapper.wait()



def test_node_wrapper_stops_its_node_once_its_head_process_is_gone(head_ready, tmp_path):
    """A Ray worker node outlives a crashed head by a minute, calling its GCS port; the wrapper ends it with the
    head: SIGTERM (Ray's drain), SIGKILL for a node that ignores it; a pid now another process's counts as gone."""
    ignoring = 'echo started >> "$0"; trap "" TERM; while :; do sleep 0.05; done'
    for script, expected in ((TRAPPING, ["started", "stopped"]), (ignoring, ["started"])):
        head = subprocess.Popen(["sleep", "600"])
        log = tmp_path / f"node-{len(expected)}"
        wrapper = subprocess.Popen(
            [sys.executable, str(RAY_NODE), head_ready, "--head", f"{head.pid}:{procs.start_time(head.pid)}", "--",
             "sh", "-c", script, str(log)], stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _lines(log, 1)
            time.sleep(0.5)
            assert wrapper.poll() is None  # its head runs: so does the node
            head.kill()
            head.wait()
            assert wrapper.wait(timeout=20) == 1
            assert _lines(log, len(expected)) == expected
            assert f"the Ray head (pid {head.pid}) is gone; stopping this node with it" in wrapper.stderr.read()
            assert processes_mentioning(str(log)) == []
        finally:
            head.kill()
            wrapper.kill()
            wrapper.wait()
    reused = subprocess.run([sys.executable, str(RAY_NODE), head_ready, "--head", f"{os.getpid()}:1", "--", "true"],
                            capture_output=True, text=True, timeout=30)
    assert reused.returncode == 1 and f"the Ray head (pid {os.getpid()}) is gone: this node does not start" in reused.stderr


def test_worker_nodes_are_told_once_the_dashboard_lists_the_head_and_up_waits_for_the_client_server(tmp_path, monkeypatch):
    """Worker nodes join the GCS, as by hand: their file is written once this user's dashboard lists the head
    node ALIVE; the head counts as ready only once its client server accepts connections too."""
    import socket
    import tempfile

    # The head's Ray temp folder (a mkdtemp one: the test's folder is too deep for Ray's sockets) goes there.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    from flytekitplugins_ddlscale.backends.local import _ray_ops as ray_ops
    from flytekitplugins_ddlscale.backends.local._ray_driver import TOKEN_PATH, RayDriver
    from flytekitplugins_ddlscale.backends.local._state import ClusterRecord, LocalStateStore
    from tests.servers.ray_dashboard import RayDashboardServer

    store = LocalStateStore(tmp_path / "local")
    ref = ClusterRef("ray", "early")
    driver = RayDriver()
    # Bound but not listening: connections to these ports are refused.
    with socket.socket() as dashboard, socket.socket() as client:
        dashboard.bind(("127.0.0.1", 0))
        client.bind(("127.0.0.1", 0))
        record = ClusterRecord(ref=ref, host="127.0.0.1", port=6380,
                               ports={"dashboard": dashboard.getsockname()[1], "client": client.getsockname()[1]})
        driver.head_argv(record, store)
        ready = store.cluster_dir(ref) / ray_ops.HEAD_READY_FILE
        assert driver.head_ready(record) is False and not ready.exists()
        with RayDashboardServer(token=Path(record.framework[TOKEN_PATH]).read_text().strip()) as head:
            record.ports["dashboard"] = head.port
            assert driver.head_ready(record) is False and ready.exists()
            client.listen()
            assert driver.head_ready(record) is True
        # A head start forgets it: the next head's worker nodes wait for that head.
        driver.head_argv(record, store)
        assert not ready.exists()


def test_worker_nodes_started_together_get_ray_temp_folders_of_their_own_short_enough_for_sockets(tmp_path):
    from flytekitplugins_ddlscale.backends.local import _ray_ops as ray_ops

    temp = "/tmp/ddlscale-ray-abcd1234"
    names = [f"{'n' * 63}-ray-worker-{i}" for i in (0, 1, 10)]
    folders = []
    for name in names:
        nodes = ray_ops.RayNodes(sys.executable, "127.0.0.1", 1, temp, str(tmp_path / "t"))
        argv = ray_ops.worker_argv(nodes, name, WorkerShape("t", 1, GIB), "/c/ray-head-ready")
        folders.append(argv[argv.index("--temp-dir") + 1])
    assert len(set(folders)) == 3 and all(f.startswith(temp + "/") for f in folders)
    # The longest socket Ray puts there: <folder>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store.
    session = "session_2026-12-03_14-36-42_112897_4194304"
    assert all(len(f"{f}/{session}/sockets/plasma_store".encode()) <= 107 for f in folders)
