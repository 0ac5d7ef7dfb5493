"""Local backend against a real Spark standalone cluster (master and worker JVMs from pyspark).

One cluster is shared by the module (each start costs several seconds of JVM
start-up on two cores); every test first brings it to the size and tier it
needs. What the code under test reports is checked against the master's own
``/json/`` status, the worker processes, and a real SparkSession job run in a
separate Python process with nothing but the connection variables.
"""
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.client import HTTPConnection, HTTPException
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from flytekitplugins_ddlscale import ClusterRef, ReplicaSpec, ScaleCluster
from flytekitplugins_ddlscale.backends.local import LocalBackend, _procs as procs
from flytekitplugins_ddlscale._framework import resolve_endpoint, wait_registered
from flytekitplugins_ddlscale.phase import cluster_phase
from tests.framework_support import SCALER_VARIABLES, use_scaler
from tests.servers.scaler_server import ScalerTestServer
from tests.test_local_security import listeners, process_tree
from tests.test_local_support import SMALL_TIERS, processes_mentioning, wait_dead


def _java_present() -> bool:
    java_home = os.environ.get("JAVA_HOME", "").strip()
    return bool(java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK)) or shutil.which("java") is not None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.starts_spark,
    pytest.mark.skipif(
        not _java_present(),
        reason="Java is absent: local Spark clusters need Java 17+ (apt-get install openjdk-17-jre-headless)",
    ),
]

TIMEOUT = 180
DDLSCALE = str(Path(sys.executable).parent / "ddlscale")

JOB = """
import json, os, sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("ddlscale-local-test").getOrCreate()
sc = spark.sparkContext
total = sc.parallelize(range(1000), 4).map(lambda x: x * x).sum()
pythons = sc.parallelize(range(4), 4).map(lambda _: sys.executable).distinct().collect()
print(json.dumps({"master": sc.master, "app": sc.applicationId, "total": total, "pythons": pythons}))
spark.stop()
"""


class Shared:
    """The module's cluster, its backend and the environment that selects them."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.state = base / "local"
        self.tiers = base / "tiers.yaml"
        self.tiers.write_text(SMALL_TIERS)
        self.backend = LocalBackend(state_dir=self.state, tiers_file=self.tiers, stop_grace=5.0)
        self.ref = ClusterRef("spark", "shared")

    def env(self) -> Dict[str, str]:
        """What makes every surface (nodes, phases, ``ddlscale``) use this state directory and tiers."""
        env = {k: v for k, v in os.environ.items() if k not in SCALER_VARIABLES and k != "CLUSTER_SCALER_BASE_URL"}
        env.update(DDLSCALE_STATE_DIR=str(self.base), DDLSCALE_LOCAL_TIERS=str(self.tiers))
        return env

    def record(self):
        return self.backend.store.load(self.ref)

    def master(self) -> Dict[str, Any]:
        """The master's own status, read here without the code under test."""
        port = self.record().ports["webui"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=10) as reply:
            return json.loads(reply.read())

    def alive_workers(self) -> List[Dict[str, Any]]:
        return [w for w in self.master()["workers"] if w["state"] == "ALIVE"]

    def size(self, replicas: int, tier: str = "Tiny") -> None:
        self.backend.up(self.ref, replicas, tier, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    cluster = Shared(tmp_path_factory.mktemp("spark"))
    yield cluster
    cluster.backend.shutdown_all()
    assert processes_mentioning(str(cluster.base)) == []


@pytest.fixture
def surface_env(shared, monkeypatch):
    """The environment of a process on this machine with nothing configured but the state directory."""
    for name in list(os.environ):
        if name in SCALER_VARIABLES or name == "CLUSTER_SCALER_BASE_URL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(shared.base))
    monkeypatch.setenv("DDLSCALE_LOCAL_TIERS", str(shared.tiers))
    return shared


def _worker_endpoints(shared) -> Dict[str, str]:
    """Worker name -> host:port the driver recorded for it."""
    record = shared.record()
    ports = record.framework["workers"]
    return {w.name: f"127.0.0.1:{ports[w.name]['port']}" for w in record.workers}


def test_scale_0_1_2_1_counts_alive_workers_on_the_master_and_retires_by_decommissioning(shared):
    backend, ref = shared.backend, shared.ref
    backend.up(ref, 0, "Tiny", timeout=TIMEOUT)
    assert shared.master()["status"] == "ALIVE" and shared.alive_workers() == []
    assert backend.get_state(ref).ready_workers == 0

    one = backend.scale(ref, 1, timeout=TIMEOUT)
    assert (one.previous.desired_workers, one.final.ready_workers, one.final.status) == (0, 1, "Running")
    [alive] = shared.alive_workers()
    assert (alive["cores"], alive["memory"]) == (1, 512)  # Tiny: 1 core, 512Mi

    reports = []
    two = backend.scale(ref, 2, timeout=TIMEOUT, progress=reports.append)
    assert (two.final.ready_workers, two.final.existing_workers) == (2, 2)
    assert "2 workers seen by the Spark master of spark/shared" in reports[-1].what
    endpoints = _worker_endpoints(shared)
    assert sorted(endpoints.values()) == sorted(f"{w['host']}:{w['port']}" for w in shared.alive_workers())

    record = shared.record()
    leaving = record.workers[-1]
    one_again = backend.scale(ref, 1, timeout=TIMEOUT)
    assert (one_again.final.ready_workers, one_again.final.existing_workers) == (1, 1)
    wait_dead(leaving.proc)
    states = {f"{w['host']}:{w['port']}": w["state"] for w in shared.master()["workers"]}
    assert states[endpoints[leaving.name]] != "ALIVE"
    assert [w.name for w in shared.record().workers] == [n for n in endpoints if n != leaving.name]
    # Retired by decommissioning (SIGPWR), not just killed: the master saw it leave that way.
    logs = shared.state / "clusters" / "_.spark.shared" / "logs"
    assert f"Decommissioning worker worker-" in (logs / "scheduler.log").read_text()
    assert f"on {endpoints[leaving.name]}" in [line.rsplit(" ", 2)[-2] + " " + line.rsplit(" ", 1)[-1]
                                             for line in (logs / "scheduler.log").read_text().splitlines()
                                             if "Decommissioning worker" in line]


def test_a_sparksession_in_user_code_connects_through_the_connection_variables_alone(shared):
    shared.size(2)
    env = dict(shared.env(), **shared.backend.connection_env(shared.ref))
    conf = Path(env["SPARK_CONF_DIR"]) / "spark-defaults.conf"
    assert f"spark.master spark://127.0.0.1:{shared.record().port}" in conf.read_text()
    done = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["master"] == f"spark://127.0.0.1:{shared.record().port}"
    assert result["total"] == sum(x * x for x in range(1000))
    assert result["pythons"] == [sys.executable]
    # The executors ran on this cluster's workers: each keeps a folder per application.
    work = shared.state / "clusters" / "_.spark.shared" / "work"
    ran_on = {p.parent.name for p in work.glob(f"*/{result['app']}")}
    assert ran_on and ran_on <= {w.name for w in shared.record().workers}
    assert result["app"] in [a["id"] for a in shared.master()["completedapps"]]


SCRATCH_JOB = """
import json, os, tempfile
from pyspark import StorageLevel
from pyspark.sql import SparkSession

# An application with JVM options of its own, as many set: they must not undo the cluster's.
spark = (SparkSession.builder.appName("ddlscale-scratch-test")
         .config("spark.driver.extraJavaOptions", "-Dddlscale.app.option=driver")
         .config("spark.executor.extraJavaOptions", "-Dddlscale.app.option=executor").getOrCreate())
sc = spark.sparkContext


def executor_jvm_options(_):
    # A Python task runs under its executor's JVM: the first java process among its ancestors.
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            args = [a.decode() for a in cmdline.read().split(b"\\0") if a]
        if args and os.path.basename(args[0]) == "java":
            return [a for a in args if a.startswith(("-Djava.io.tmpdir=", "-Dddlscale.app.option="))]
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
    return ["no executor JVM found"]


# A shuffle, and blocks kept on disk: what executors write to their local folders.
pairs = sc.parallelize(range(20000), 4).map(lambda x: (x % 13, x)).persist(StorageLevel.DISK_ONLY)
counted = pairs.reduceByKey(lambda a, b: a + b).count()
executors = sorted(set(pairs.mapPartitions(lambda _: [os.environ.get("SPARK_LOCAL_DIRS", "")]).collect()))
executor_options = sc.parallelize(range(4), 4).mapPartitions(lambda part: [tuple(executor_jvm_options(part))]).collect()
system = sc._jvm.System
driver = [sc.getConf().get("spark.local.dir", tempfile.gettempdir()), system.getProperty("java.io.tmpdir")]
print(json.dumps({"counted": counted, "executors": executors, "driver": driver,
                  "app_option": system.getProperty("ddlscale.app.option"),
                  "executor_options": sorted(set(executor_options)),
                  "tmp": sorted(os.listdir(tempfile.gettempdir()))}))
spark.stop()
"""
SPARK_TEMPORARY = ("spark-", "blockmgr-", "executor-", "commons-crypto-")
"""What Spark's processes make in the system's temporary folder when nothing moves them."""


def test_no_spark_process_of_a_local_cluster_keeps_files_where_other_users_can_list_them(shared):
    """Spark keeps shuffle and block files in ``spark.local.dir`` (/tmp by default), in folders it makes
    0755: another user of the machine could read an application's data there. The executors' and the
    driver's local folders and temporary files, and the daemons', are in the cluster's private folder,
    and nothing Spark makes appears in the system's temporary folder."""
    import tempfile

    shared.size(2)
    before = set(os.listdir(tempfile.gettempdir()))
    env = dict(shared.env(), **shared.backend.connection_env(shared.ref))
    done = subprocess.run([sys.executable, "-c", SCRATCH_JOB], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["counted"] == 13
    private = str(shared.state.resolve()) + os.sep
    folders = [f for joined in seen["executors"] for f in joined.split(",")] + seen["driver"]
    assert seen["executors"] and [f for f in folders if not f.startswith(private)] == []
    # The application's own JVM options are kept, after the cluster's temporary folder, in both JVMs.
    assert seen["app_option"] == "driver"
    assert seen["executor_options"], seen
    for options in seen["executor_options"]:
        assert options[-1] == "-Dddlscale.app.option=executor", options
        assert [o for o in options if o.startswith("-Djava.io.tmpdir=" + private)], options
    appeared = set(seen["tmp"]) | set(os.listdir(tempfile.gettempdir()))
    assert sorted(n for n in appeared - before if n.startswith(SPARK_TEMPORARY)) == []
    for proc in [shared.record().scheduler, *(w.proc for w in shared.record().workers)]:
        command = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert [c for c in command if c.startswith(b"-Djava.io.tmpdir=" + private.encode())], command


def test_framework_check_reads_the_real_master_from_the_connection_variables(shared):
    shared.size(2)
    env = shared.backend.connection_env(shared.ref)
    endpoint = resolve_endpoint("spark", env=env)
    assert endpoint is not None
    webui = f"http://127.0.0.1:{shared.record().ports['webui']}"
    assert endpoint.url == webui
    assert "spark.master in" in endpoint.source
    registered = wait_registered(endpoint, 2, timeout=30)
    assert registered.proof == f"2 workers registered with the Spark master at {webui}"
    by_url = resolve_endpoint("spark", env={"DDLSCALE_SPARK_URL": webui})
    assert wait_registered(by_url, 2, timeout=30).workers == 2


@pytest.mark.parametrize("surface", ["node", "cli", "phase"])
def test_surfaces_on_domino_wait_for_the_real_master_found_through_the_connection_variables(
    surface, shared, tmp_path, monkeypatch
):
    """The scaler backend (its test server lists pods at once) with this real cluster as the run's
    Spark cluster: each surface returns only once the second worker is ALIVE on the real master."""
    shared.size(1)
    with ScalerTestServer(pod_ready_delay=0.2) as server:
        server.add_cluster("spark", "spark-fw", replicas=1, max_replicas=4, min_replicas=None)
        use_scaler(monkeypatch, server, tmp_path / "scaler-state")
        for key, value in shared.backend.connection_env(shared.ref).items():
            monkeypatch.setenv(key, value)
        grow = threading.Thread(target=lambda: shared.backend.scale(shared.ref, 2, timeout=TIMEOUT))
        grow.start()
        try:
            if surface == "node":
                outcome = ScaleCluster("up_fw", cluster="spark/spark-fw", replicas=2, timeout=TIMEOUT)()
                proof, alive = outcome.readiness, len(shared.alive_workers())
            elif surface == "cli":
                done = subprocess.run(
                    [DDLSCALE, "scale", "--kind", "spark", "--name", "spark-fw", "--replicas", "2", "--timeout",
                     str(TIMEOUT), "--json"], capture_output=True, text=True, timeout=TIMEOUT + 60, env=dict(os.environ),
                )
                alive = len(shared.alive_workers())
                assert done.returncode == 0, done.stderr
                proof = json.loads(done.stdout)["readiness"]
            else:
                # The real workers are not the scaler test server's to remove: the phase gives back the size the
                # real master keeps listing, so the framework check after its restore (at most N registered) holds.
                with cluster_phase("spark/spark-fw", 2, restore=ReplicaSpec(2), timeout=TIMEOUT, reassert_interval=None,
                                   deck=False) as phase:
                    proof, alive = phase.framework_check, len(shared.alive_workers())
        finally:
            grow.join(TIMEOUT)
    webui = f"http://127.0.0.1:{shared.record().ports['webui']}"
    assert alive == 2
    assert f"2 workers registered with the Spark master at {webui}" in proof
    assert "worker pods exist (scaler" in proof


def test_scale_node_reports_workers_registered_with_the_spark_master(surface_env):
    shared = surface_env
    shared.size(1)
    outcome = ScaleCluster("up_spark", cluster="spark/shared", replicas=2, worker_hw_tier="Tiny", timeout=TIMEOUT)()
    assert outcome.ready_workers == 2 and outcome.waited
    assert outcome.readiness == "2 workers registered with the Spark master (local backend)"
    assert len(shared.alive_workers()) == 2


def test_cli_scale_and_a_phase_report_the_spark_master(surface_env):
    shared = surface_env
    shared.size(1)
    done = subprocess.run(
        [DDLSCALE, "scale", "--kind", "spark", "--name", "shared", "--replicas", "2", "--timeout", str(TIMEOUT),
         "--json"],
        capture_output=True, text=True, timeout=TIMEOUT + 60, env=shared.env(),
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["final"]["ready_workers"] == 2
    assert "2 workers registered with the Spark master (local backend)" in result["readiness"]
    shared.size(1)
    with cluster_phase("spark/shared", 2, timeout=TIMEOUT, reassert_interval=None, deck=False) as phase:
        assert len(shared.alive_workers()) == 2
        assert "2 workers registered with the Spark master (local backend)" in phase.framework_check
        assert os.environ["SPARK_CONF_DIR"] == shared.record().framework["conf_dir"]


def test_tier_change_replaces_workers_with_the_new_cores_and_memory(shared):
    shared.size(1, "Tiny")
    old = shared.record().workers
    result = shared.backend.scale(shared.ref, 1, "Duo", timeout=TIMEOUT)
    assert (result.final.ready_workers, result.final.worker_hw_tier) == (1, "Duo")
    for worker in old:
        wait_dead(worker.proc)
    [alive] = shared.alive_workers()
    assert (alive["cores"], alive["memory"]) == (2, 768)  # Duo: 2.5 cores rounded down, 768Mi
    defaults = Path(shared.record().framework["conf_dir"]) / "spark-defaults.conf"
    assert "spark.executor.memory 768m" in defaults.read_text()


def test_head_restart_keeps_the_master_port_and_brings_the_same_workers_back(shared):
    shared.size(2)
    before = shared.record()
    result = shared.backend.restart_head(shared.ref, timeout=TIMEOUT)
    after = shared.record()
    assert result.ready and result.final.ready_workers == 2
    assert after.port == before.port and after.scheduler.pid != before.scheduler.pid
    assert [w.name for w in after.workers] == [w.name for w in before.workers]
    assert not any(procs.is_alive(w.proc) for w in before.workers)
    assert len(shared.alive_workers()) == 2
    assert shared.master()["url"] == f"spark://127.0.0.1:{before.port}"


def test_a_killed_worker_and_a_killed_master_are_repaired(shared):
    shared.size(2)
    victim = shared.record().workers[0]
    os.kill(victim.proc.pid, signal.SIGKILL)
    wait_dead(victim.proc)
    assert shared.backend.get_state(shared.ref).status != "Running"
    repaired = shared.backend.repair(shared.ref, timeout=TIMEOUT)
    assert (repaired.ready_workers, repaired.status) == (2, "Running")
    assert victim.name not in [w.name for w in shared.record().workers]

    record = shared.record()
    os.kill(record.scheduler.pid, signal.SIGKILL)
    wait_dead(record.scheduler)
    assert shared.backend.get_state(shared.ref).head_ready is False
    repaired = shared.backend.repair(shared.ref, timeout=TIMEOUT)
    assert (repaired.ready_workers, repaired.head_ready) == (2, True)
    assert shared.record().port == record.port
    assert not any(procs.is_alive(w.proc) for w in record.workers)
    assert len(shared.alive_workers()) == 2


HELD_JOB = """
import json, os, sys, time
from pyspark.sql import SparkSession

release = sys.argv[1]
spark = SparkSession.builder.appName("ddlscale-held-job").getOrCreate()
sc = spark.sparkContext
print(json.dumps({"app": sc.applicationId, "ui": sc.uiWebUrl}), flush=True)


def held(_):
    # Each task runs until the test releases it (at most 5 minutes), so the job is running meanwhile.
    deadline = time.monotonic() + 300
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test never created {release}")
        time.sleep(0.05)
    return 1


print(json.dumps({"total": sc.parallelize(range(2), 2).map(held).sum()}), flush=True)
spark.stop()
"""
CHANGING_REQUESTS = (
    "/workers/kill/?host=127.0.0.1",  # the master: decommission every worker on the host
    "/app/kill/?id={app}&terminate=true",  # the master: kill an application
    "/driver/kill/?id={app}&terminate=true",  # the master: kill a driver
    "/jobs/job/kill/?id={job}",  # an application's driver: kill a job
    "/stages/stage/kill/?id={stage}",  # an application's driver: kill a stage
    "/v1/submissions/kill/{app}",  # the REST submission server
    "/v1/submissions/killall",
)
"""What an HTTP POST can ask of Spark's web UIs and REST submission server to change a cluster."""


def _host_port(address: str) -> Tuple[str, int]:
    """A listener's address as ``listeners`` spells it (an IPv4-mapped IPv6 one in brackets), to connect to."""
    host, port = address.rsplit(":", 1)
    ip = ipaddress.ip_address(host.strip("[]"))
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip), int(port)


def _post(address: str, path: str) -> str:
    """POST ``path`` to the listener at ``host:port`` without following a redirect: its status line, or
    what refused it (a listener that does not speak HTTP)."""
    connection = HTTPConnection(*_host_port(address), timeout=10)
    try:
        connection.request("POST", path, body=b"", headers={"Content-Length": "0"})
        return str(connection.getresponse().status)
    except (OSError, HTTPException) as exc:
        return type(exc).__name__
    finally:
        connection.close()


def _wait_until(what: str, check, timeout: float = 120.0):
    """``check()``'s first true answer, polled until ``timeout`` seconds have passed (then fail saying ``what``)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        assert time.monotonic() < deadline, f"waited {timeout:g}s for {what}"
        time.sleep(0.1)


def _read_json(url: str):
    """What the driver's REST API answers at ``url``; None while it does not answer (a busy machine)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return json.loads(reply.read())
    except OSError:
        return None


def test_no_http_request_to_any_listener_of_a_cluster_or_its_application_changes_it(shared, tmp_path):
    """Spark's web UIs and REST server answer every local user without authentication. With an
    application's job running, every listening port of the master, the workers, the executors and the
    application's driver is asked, by POST, to decommission the workers, kill the application, its
    driver, its job or its stage: none accepts (a status below 400), the workers stay ALIVE on the
    master and the job completes."""
    shared.size(2)
    release = tmp_path / "release"
    env = dict(shared.env(), **shared.backend.connection_env(shared.ref))
    app = subprocess.Popen([sys.executable, "-c", HELD_JOB, str(release)], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        started = json.loads(app.stdout.readline() or "null")
        assert started, app.stderr.read()[-3000:] if app.poll() is not None else "no first line"
        api = f"{started['ui']}/api/v1/applications/{started['app']}"
        [job] = _wait_until("the application's job to run", lambda: [
            j["jobId"] for j in _read_json(f"{api}/jobs") or [] if j["status"] == "RUNNING"])
        [stage] = _wait_until("the job's stage to run", lambda: [
            s["stageId"] for s in _read_json(f"{api}/stages?status=active") or []])
        record = shared.record()
        pids = process_tree({record.scheduler.pid, *(w.proc.pid for w in record.workers)}) | process_tree(
            {app.pid}, by_session=False)
        addresses = sorted({address for _, _, address in listeners(pids)})
        assert ("127.0.0.1", record.ports["webui"]) in {_host_port(a) for a in addresses}
        answers = {}
        for address in addresses:
            for path in CHANGING_REQUESTS:
                answers[address, path] = _post(address, path.format(app=started["app"], job=job, stage=stage))
                if not answers[address, path].isdigit():
                    break  # no HTTP server (an RPC port, a Python worker daemon that waits for more): asked once
        accepted = {key: status for key, status in answers.items() if status.isdigit() and int(status) < 400}
        assert accepted == {}, accepted
        states = {f"{w['host']}:{w['port']}": w["state"] for w in shared.master()["workers"]}
        assert {endpoint: states.get(endpoint) for endpoint in _worker_endpoints(shared).values()} == {
            endpoint: "ALIVE" for endpoint in _worker_endpoints(shared).values()}
        assert [j["status"] for j in _read_json(f"{api}/jobs") if j["jobId"] == job] == ["RUNNING"]
        release.touch()
        out, err = app.communicate(timeout=TIMEOUT)
        assert app.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"total": 2}
    finally:
        release.touch()
        if app.poll() is None:
            app.kill()
        app.wait(timeout=60)
    assert shared.backend.get_state(shared.ref).ready_workers == 2


def test_status_repair_replaces_a_decommissioned_and_a_killed_worker(shared):
    """A worker decommissioned (SIGPWR, as the master's decommission does) keeps running but never gets
    work again, and one killed is gone: ``ddlscale local status --repair`` stops the first and replaces
    both, and the master shows the cluster's size ALIVE again."""
    shared.size(2)
    endpoints = _worker_endpoints(shared)
    decommissioned, killed = shared.record().workers
    os.kill(decommissioned.proc.pid, signal.SIGPWR)
    os.kill(killed.proc.pid, signal.SIGKILL)
    wait_dead(killed.proc)
    _wait_until(f"the master to show {decommissioned.name} DECOMMISSIONED", lambda: [
        w for w in shared.master()["workers"]
        if f"{w['host']}:{w['port']}" == endpoints[decommissioned.name] and w["state"] == "DECOMMISSIONED"])
    assert procs.is_alive(decommissioned.proc)
    local = [DDLSCALE, "local", "--state-dir", str(shared.state.parent), "--tiers-file", str(shared.tiers)]
    repaired = subprocess.run(local + ["status", "--kind", "spark", "--name", "shared", "--repair", "--timeout", "60"],
                              capture_output=True, text=True, timeout=TIMEOUT, env=shared.env())
    assert repaired.returncode == 0, repaired.stderr
    assert "spark/shared Running: workers 2/2 ready" in repaired.stdout, repaired.stdout
    wait_dead(decommissioned.proc, timeout=30)
    names = [w.name for w in shared.record().workers]
    assert len(names) == 2 and not {decommissioned.name, killed.name} & set(names), names
    assert sorted(f"{w['host']}:{w['port']}" for w in shared.alive_workers()) == sorted(
        _worker_endpoints(shared).values())


def test_cli_local_up_status_down_for_spark(shared):
    env = shared.env()
    local = [DDLSCALE, "local", "--state-dir", str(shared.state.parent), "--tiers-file", str(shared.tiers)]
    up = subprocess.run(local + ["up", "--kind", "spark", "--name", "cli", "--replicas", "1", "--json"],
                        capture_output=True, text=True, timeout=TIMEOUT + 60, env=env)
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    assert (info["ready_workers"], info["address"]) == (1, info["master_url"])
    assert set(info["env"]) == {"SPARK_CONF_DIR", "PYSPARK_PYTHON", "SPARK_LOCAL_IP", "DDLSCALE_SPARK_WEBUI_PORT"}
    status = subprocess.run(local + ["status", "--kind", "spark", "--name", "cli"],
                            capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert status.returncode == 0, status.stderr
    assert "spark/cli Running: workers 1/1 ready" in status.stdout
    assert f"SPARK_CONF_DIR={info['env']['SPARK_CONF_DIR']}" in status.stdout
    cluster_pids = [info["scheduler_pid"]] + [w["pid"] for w in info["workers"]]
    down = subprocess.run(local + ["down", "--kind", "spark", "--name", "cli"],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert down.returncode == 0, down.stderr
    assert [pid for pid in cluster_pids if procs.start_time(pid) is not None] == []
    assert processes_mentioning(str(shared.state / "clusters" / "_.spark.cli")) == []


def test_down_leaves_no_java_process_behind(shared):
    shared.size(1)
    assert processes_mentioning(str(shared.base))
    assert shared.backend.down(shared.ref)
    assert processes_mentioning(str(shared.base)) == []
    assert shared.backend.list_clusters() == []
