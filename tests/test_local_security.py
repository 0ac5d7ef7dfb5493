"""Local clusters are single-user: loopback only, no inherited credentials, each behind its framework's
authentication (Dask TLS, Ray's token, Spark's secret), no secret on a command line.

One real cluster per kind (Dask, Ray, Spark; 1 worker) is started with a
secret in the starting process's environment, and a client session (a
separate Python process that connects through the connection variables
alone and runs a task on the cluster) is held open while the tests look
at the processes. What is checked is read here from the kernel, not from
the code under test: every listening TCP socket of every process of the
cluster (found by session and parentage under /proc: Ray's GCS, raylets,
agents, client servers and ``ray::`` workers, Spark's JVMs and executors)
and of the client (a Spark driver's JVM), mapped through
``/proc/<pid>/fd`` to ``/proc/net/tcp{,6}``; and ``/proc/<pid>/environ``
of every cluster process; ``/proc/<pid>/cmdline`` (readable by every user) of
every cluster and client process. Another user's attempts are in
``test_local_other_user.py``.
"""
import importlib.util
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

from flytekitplugins_ddlscale import ClusterRef, InvalidInputError
from flytekitplugins_ddlscale.backends.local import LocalBackend
from flytekitplugins_ddlscale.backends.local._process_env import cluster_environment
from tests.test_local_support import SMALL_TIERS, descriptor_targets, processes_mentioning

SECRET_NAME = "DDLSCALE_TEST_SERVICE_API_KEY"
SECRET = "s3cret-value-that-must-stay-home-7f3a"
DOMINO_SECRET = "domino-key-that-must-stay-home-91c2"
TIMEOUT = 240.0
READY_WITHIN = 240.0


def _java_present() -> bool:
    java_home = os.environ.get("JAVA_HOME", "").strip()
    return bool(java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK)) or shutil.which("java") is not None


def _ray_present() -> bool:
    return (Path(sys.executable).parent / "ray").exists() or shutil.which("ray") is not None


KINDS = [
    "dask",
    pytest.param("ray", marks=[pytest.mark.slow, pytest.mark.starts_ray, pytest.mark.skipif(not _ray_present(), reason="Ray is not installed")]),
    pytest.param("spark", marks=[
        pytest.mark.slow,
        pytest.mark.starts_spark,
        pytest.mark.skipif(not _java_present() or importlib.util.find_spec("pyspark") is None,
                           reason="local Spark clusters need pyspark and Java 17+"),
    ]),
]

# Each client connects through the connection variables alone, runs a task on the cluster that
# reports the environment variable names it sees, prints them as one JSON line, then holds its
# session open until its stdin closes.
CLIENTS = {
    "dask": """
        import json, os, sys
        from distributed import Client
        client = Client(f"{os.environ['DASK_SCHEDULER_SERVICE_HOST']}:{os.environ['DASK_SCHEDULER_SERVICE_PORT']}")
        names = client.submit(lambda: sorted(os.environ), pure=False).result(timeout=120)
    """,
    "ray": """
        import json, os, sys, ray
        ray.init(f"ray://{os.environ['RAY_HEAD_SERVICE_HOST']}:{os.environ['RAY_HEAD_SERVICE_PORT']}")
        names = ray.get(ray.remote(lambda: sorted(os.environ)).remote(), timeout=120)
    """,
    "spark": """
        import json, os, sys
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.appName("ddlscale-security").getOrCreate()
        names = spark.sparkContext.parallelize([0], 1).map(lambda _: sorted(os.environ)).collect()[0]
    """,
}
HOLD = """
        print(json.dumps(names), flush=True)
        sys.stdin.read()
"""


# ------------------------------------------------------------------ /proc readers


def _stat(pid: int) -> List[str]:
    """Fields of /proc/<pid>/stat after the command name: [0] state, [1] ppid, [3] session."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def _all_processes() -> Dict[int, Tuple[int, int]]:
    """Every running process: pid -> (parent pid, session id)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        if fields[0] not in ("Z", "X"):
            found[int(entry.name)] = (int(fields[1]), int(fields[3]))
    return found


def process_tree(roots: Set[int], by_session: bool = True) -> Set[int]:
    """``roots``, every process in their sessions (a cluster process is started in a session of
    its own) and every descendant of any of those."""
    table = _all_processes()
    sessions = {table[p][1] for p in roots if p in table} if by_session else set()
    found = {p for p in roots if p in table} | {p for p, (_, sid) in table.items() if sid in sessions}
    grew = True
    while grew:
        more = {p for p, (ppid, _) in table.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def _listening_inodes() -> Dict[int, str]:
    """Socket inode -> local address of every listening TCP socket (IPv4 and IPv6)."""
    listening = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            # The kernel prints each 32-bit word in host (little-endian) order.
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            address = ipaddress.ip_address(packed)
            listening[int(fields[9])] = f"{address}:{int(hex_port, 16)}" if width == 8 else f"[{address}]:{int(hex_port, 16)}"
    return listening


def listeners(pids: Set[int]) -> List[Tuple[int, str, str]]:
    """(pid, command, local address) of every listening TCP socket held by ``pids``."""
    listening = _listening_inodes()
    found = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
            links = list(descriptor_targets(pid).values())
        except (FileNotFoundError, ProcessLookupError):  # the process is gone
            continue
        for link in links:
            if link.startswith("socket:[") and int(link[8:-1]) in listening:
                found.append((pid, command, listening[int(link[8:-1])]))
    return found


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    ip = ipaddress.ip_address(host)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def environ_of(pid: int) -> Dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)


# ------------------------------------------------------------------ fixtures


class Cluster:
    """One running local cluster of ``kind`` and the client session held open on it."""

    def __init__(self, kind: str, base: Path) -> None:
        self.kind = kind
        self.base = base
        tiers = base / "tiers.yaml"
        tiers.write_text(SMALL_TIERS)
        # A Ray head took over 60 s to answer while other suites loaded the 2 cores (load 10-20).
        self.backend = LocalBackend(state_dir=base / "local", tiers_file=tiers, stop_grace=5.0, start_timeout=180.0)
        self.ref = ClusterRef(kind, "sec")
        self.client: "subprocess.Popen[str]"
        self.task_env_names: List[str] = []

    def cluster_pids(self) -> Set[int]:
        """Every process of the cluster: the recorded head and workers, their sessions and descendants."""
        record = self.backend.store.load(self.ref)
        roots = {record.scheduler.pid} | {w.proc.pid for w in record.workers}
        return process_tree(roots)

    def client_pids(self) -> Set[int]:
        return process_tree({self.client.pid}, by_session=False)


@pytest.fixture(scope="module", params=KINDS)
def cluster(request, tmp_path_factory) -> Iterator[Cluster]:
    """A 1-worker cluster started with secrets in the environment, and a client session on it."""
    kind = request.param
    found = Cluster(kind, tmp_path_factory.mktemp(f"sec-{kind}"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SECRET_NAME, SECRET)
        patch.setenv("DOMINO_USER_API_KEY", DOMINO_SECRET)
        found.backend.up(found.ref, 1, "Tiny", timeout=TIMEOUT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_SCHEDULER", "RAY_HEAD", "SPARK_"))}
    env.update(found.backend.connection_env(found.ref))
    script = textwrap.dedent(CLIENTS[kind]) + textwrap.dedent(HOLD)
    found.client = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )
    try:
        line = _read_line(found.client, READY_WITHIN)
        found.task_env_names = json.loads(line)
        yield found
    finally:
        found.client.stdin.close()
        try:
            found.client.wait(timeout=60)
        except subprocess.TimeoutExpired:
            found.client.kill()
            found.client.wait()
        found.backend.shutdown_all()
        deadline = time.monotonic() + 20
        while processes_mentioning(str(found.base), environment=True) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_mentioning(str(found.base), environment=True) == []


def _read_line(client: "subprocess.Popen[str]", timeout: float) -> str:
    """The client's first stdout line, within ``timeout`` s (its stderr tail if it exits first)."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(client.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if selector.select(timeout=1.0):
            line = client.stdout.readline()
            if line.strip():
                return line
        if client.poll() is not None:
            pytest.fail(f"the client exited ({client.returncode}) before its task ran:\n{client.stderr.read()[-3000:]}")
    client.kill()
    pytest.fail(f"the client did not report its task within {timeout:.0f}s")


# ------------------------------------------------------------------ tests


def test_every_listening_socket_of_the_cluster_and_its_client_is_on_loopback(cluster):
    pids = cluster.cluster_pids() | cluster.client_pids()
    found = listeners(pids)
    # Not vacuous: the head, the worker and the session are all listening somewhere.
    assert len({pid for pid, _, _ in found}) >= 2, found
    exposed = [(pid, command, address) for pid, command, address in found if not is_loopback(address)]
    assert exposed == [], "listening beyond loopback:\n" + "\n".join(map(str, exposed))


def test_no_cluster_process_and_no_task_sees_the_starters_credentials(cluster):
    pids = cluster.cluster_pids()
    assert len(pids) >= 2
    leaking = []
    for pid in pids:
        try:
            env = environ_of(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
        text = "\0".join(f"{k}={v}" for k, v in env.items())
        if SECRET in text or DOMINO_SECRET in text or SECRET_NAME in env or "DOMINO_USER_API_KEY" in env:
            leaking.append((pid, Path(f"/proc/{pid}/cmdline").read_bytes()[:100]))
    assert leaking == []
    # The cluster still works: the task ran, and saw a usable environment but no credential.
    assert "PATH" in cluster.task_env_names and "HOME" in cluster.task_env_names
    assert SECRET_NAME not in cluster.task_env_names and "DOMINO_USER_API_KEY" not in cluster.task_env_names


def _cluster_secrets(cluster: Cluster) -> List[str]:
    """The secrets a client of the cluster holds: Dask's private key, Ray's token, Spark's shared secret."""
    folder = cluster.backend.store.cluster_dir(cluster.ref)
    files = {"dask": folder / "tls" / "cluster-key.pem", "ray": folder / "ray-auth-token", "spark": folder / "spark-auth-secret"}
    text = files[cluster.kind].read_text()
    # A PEM key's base64 lines, each long enough to be found only where the key went.
    return [line for line in text.splitlines() if not line.startswith("-----") and len(line) >= 16] or [text]


def test_no_secret_of_the_cluster_is_on_a_command_line_or_in_its_variables(cluster):
    secrets = _cluster_secrets(cluster)
    assert secrets and all(len(secret) >= 16 for secret in secrets)
    pids = cluster.cluster_pids() | cluster.client_pids()
    exposed = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue
        exposed += [(pid, command[:100]) for secret in secrets if secret in command]
    assert exposed == []
    # What a client is handed names files in the cluster's private folder, never their contents.
    env = json.dumps(cluster.backend.connection_env(cluster.ref))
    assert not any(secret in env for secret in secrets)


def test_the_ray_head_answers_only_with_the_clusters_token(cluster):
    if cluster.kind != "ray":
        pytest.skip("the token is Ray's; Dask's TLS and Spark's secret refuse another user in test_local_other_user.py")
    env = cluster.backend.connection_env(cluster.ref)
    token_file = Path(env["RAY_AUTH_TOKEN_PATH"])
    assert token_file.parent == cluster.backend.store.cluster_dir(cluster.ref)
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert env["RAY_AUTH_MODE"] == "token" and token_file.read_text().strip() not in json.dumps(env)
    url = f"http://127.0.0.1:{env['DDLSCALE_RAY_DASHBOARD_PORT']}/api/v0/nodes"
    for headers, status in (({}, 401), ({"Authorization": "Bearer not-the-token"}, 403)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
        assert refused.value.code == status
    token = token_file.read_text().strip()
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}), timeout=10) as ok:
        assert ok.status == 200


def test_a_local_backend_refuses_to_listen_beyond_loopback(tmp_path):
    for host in ("0.0.0.0", "192.168.1.10", "::", "localhost"):
        with pytest.raises(InvalidInputError) as refused:
            LocalBackend(state_dir=tmp_path / "state", host=host)
        assert refused.value.field == "host" and "allowed: 127.0.0.1" in str(refused.value)
    assert not (tmp_path / "state").exists()


def test_cluster_processes_start_with_an_allow_list_that_drops_credentials():
    starter = {
        "PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C", "JAVA_HOME": "/opt/java",
        "VIRTUAL_ENV": "/venv", "DASK_DISTRIBUTED__WORKER__DAEMON": "False", "RAY_DEDUP_LOGS": "0",
        "SPARK_HOME": "/opt/spark", "DOMINO_API_KEY": "k", "DOMINO_USER_API_KEY": "k", "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "s", "GITHUB_TOKEN": "t", "RAY_AUTH_TOKEN": "t", "DB_PASSWORD": "p",
        "KUBECONFIG": "/k", "MY_SERVICE_SECRET": "s", "HTTPS_PROXY": "http://user:pw@proxy:3128",
        "GOOGLE_APPLICATION_CREDENTIALS": "/c.json", "SOME_UNRELATED_SETTING": "x", "DDLSCALE_WATCH_GRACE": "5",
        "DDLSCALE_STATE_DIR": "/s",
    }
    assert cluster_environment(starter) == {
        "PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C", "JAVA_HOME": "/opt/java",
        "VIRTUAL_ENV": "/venv", "DASK_DISTRIBUTED__WORKER__DAEMON": "False", "RAY_DEDUP_LOGS": "0",
        "SPARK_HOME": "/opt/spark", "DDLSCALE_WATCH_GRACE": "5",
    }
