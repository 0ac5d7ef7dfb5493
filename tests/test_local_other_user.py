"""Another user of the same machine can neither run code on a local cluster nor catch its secrets.

The attacker is a real second local user: where the tests run as root (here
and in CI), an ordinary user is created (``useradd``, once) and the
attacker's code runs in a child that drops to that user's uid and gid
(``os.setuid``) after importing what it needs, so it holds exactly that
user's rights: it cannot read the owner's 0700 cluster folder, and its
sockets are its own. Elsewhere these tests skip: becoming another user takes
root.

* Dask: its ``Client`` is refused over plain ``tcp://`` and over ``tls://``
  with a certificate of its own authority, and so is a direct call to a
  worker; the cluster's folder and key are unreadable to it, and the list
  of registered workers the scheduler keeps there cannot be rewritten.
* Ray: a listener it holds on the port the owner reads the dashboard from
  (as on a head restart, before the dashboard binds it again) is connected
  to and receives nothing: not the token, not a byte. A gRPC server it
  starts on a crashed head's GCS port gets no call (Ray's mutual TLS), a
  raylet answers none of its calls even with the cluster's token, and
  ``restart-head`` and ``status --repair`` move the head off the port.
* Spark: the master answers its first RPC with Spark's authentication
  failure; the cluster's secret is unreadable to it.
"""
import importlib.util
import json
import os
import pwd
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.local import LocalBackend, _procs as procs
from flytekitplugins_ddlscale.backends.local import _ray_ops as ray_ops
from flytekitplugins_ddlscale.backends.local._secrets import DaskTls
from flytekitplugins_ddlscale._framework.endpoints import Endpoint
from flytekitplugins_ddlscale._framework.probes import PROBES
from flytekitplugins_ddlscale._framework.wait import HeadUnreachable, read_registered
from tests.servers.ray_dashboard import RayDashboardServer
from tests.test_local_support import SMALL_TIERS, processes_mentioning, scheduler_workers, wait_dead

DDLSCALE = str(Path(sys.executable).parent / "ddlscale")
OTHER_USER = "ddlscale-other"
ATTEMPT_TIMEOUT = 3

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="acting as a second local user needs root (to create one with useradd and switch to it)",
)


@pytest.fixture(scope="module")
def other_user() -> pwd.struct_passwd:
    """An ordinary local user other than the owner, created once (no home, no login shell)."""
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
            capture_output=True, text=True, timeout=60,
        )
        # Another test process may have made it meanwhile (useradd then exits 9): it exists either way.
        try:
            return pwd.getpwnam(OTHER_USER)
        except KeyError:
            pytest.fail(f"could not create local user {OTHER_USER}: {made.stderr.strip()}")


def as_other_user(user: pwd.struct_passwd, imports: str, body: str, args: Dict[str, Any], timeout: float = 120,
                  **popen: Any) -> "subprocess.Popen[str]":
    """Start Python running ``body`` as ``user`` with ``args`` (a dict named ``args``), after running
    ``imports`` as the owner (the interpreter's own files may be unreadable to ``user``)."""
    script = "\n".join([
        "import json, os, sys",
        textwrap.dedent(imports),
        "args = json.loads(sys.argv[1])",
        f"os.setgroups([]); os.setgid({user.pw_gid}); os.setuid({user.pw_uid})",
        f"assert os.geteuid() == {user.pw_uid} and os.getegid() == {user.pw_gid}",
        textwrap.dedent(body),
    ])
    return subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(args)], cwd="/", text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen,
    )


def outcome_of(process: "subprocess.Popen[str]", timeout: float = 120, stdin: str = "") -> Dict[str, Any]:
    """The JSON the attacker printed last, once it exited."""
    out, err = process.communicate(stdin, timeout=timeout)
    assert process.returncode == 0, f"the attacker's script failed ({process.returncode}):\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def local_backend(tmp_path) -> Iterator[LocalBackend]:
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text(SMALL_TIERS)
    backend = LocalBackend(state_dir=tmp_path / "local", tiers_file=tiers, start_timeout=180.0)
    try:
        yield backend
    finally:
        backend.shutdown_all()
        left = processes_mentioning(str(tmp_path), environment=True)
        assert left == [], [_cmdline(pid).replace("\0", " ")[:200] for pid in left]


# ------------------------------------------------------------------ Dask

DASK_IMPORTS = """
    import tempfile
    from distributed import Client
    from distributed.core import rpc
    from flytekitplugins_ddlscale.backends.local._secrets import ensure_tls
    import asyncio, ssl, cryptography.hazmat.primitives.asymmetric.ec, cryptography.x509
    import shutil, distributed.comm.tcp
    # The checkout (and its venv) may sit in a folder the other user cannot read, as CI's copy does: make and
    # use a throwaway authority once as the owner, so everything that imports lazily is imported.
    warm = tempfile.mkdtemp()
    try:  # and a client's connection, to a port nothing listens on
        Client("tls://127.0.0.1:9", timeout=1, set_as_default=False,
               security=ensure_tls(__import__("pathlib").Path(warm)).security())
    except OSError:
        pass
    shutil.rmtree(warm)
"""
DASK_ATTACK = """
    results = {}
    def attempt(name, action):
        # A refusal is a failed connection or file access (Dask's CommClosedError is an OSError), not
        # anything else that could go wrong in this script (an import, a typo).
        try:
            action()
            results[name] = "accepted"
        except PermissionError:
            results[name] = "PermissionError"
        except (OSError, asyncio.TimeoutError):
            results[name] = "refused"
        except Exception as exc:
            results[name] = f"{type(exc).__name__}: {exc}"
    folder = args["folder"]
    attempt("list the cluster's folder", lambda: os.listdir(folder))
    attempt("read the cluster's key", lambda: open(os.path.join(folder, "tls", "cluster-key.pem")).read())
    attempt("rewrite the list of workers", lambda: open(os.path.join(folder, "dask-workers.json"), "w").write("[]"))
    own = ensure_tls(__import__("pathlib").Path(tempfile.mkdtemp()))
    def client(address, **kwargs):
        Client(address, timeout=args["timeout"], set_as_default=False, **kwargs).close()
    attempt("Client over tcp://", lambda: client(f"tcp://127.0.0.1:{args['port']}"))
    attempt("Client over tls:// with its own certificate", lambda: client(
        f"tls://127.0.0.1:{args['port']}", security=own.security()))
    async def to_worker():
        connection = own.security().get_connection_args("client")
        async with rpc(args["worker"], timeout=args["timeout"], connection_args=connection) as worker:
            await asyncio.wait_for(worker.identity(), args["timeout"])
    attempt("call a worker directly", lambda: asyncio.run(to_worker()))
    print(json.dumps(results))
"""


def test_another_user_cannot_reach_a_local_dask_cluster_or_read_its_certificate(local_backend, other_user):
    ref = ClusterRef("dask", "guarded")
    local_backend.up(ref, 1, "Tiny", timeout=120)
    record = local_backend.store.load(ref)
    folder = local_backend.store.cluster_dir(ref)
    # The owner, holding the cluster's certificate, is served.
    workers = scheduler_workers(record.address, folder)
    assert list(workers) == [record.workers[0].name]
    worker_address = _worker_address(record.address, folder)
    assert worker_address.startswith("tls://127.0.0.1:")

    tls = DaskTls.of(folder)
    assert [oct(p.stat().st_mode & 0o777) for p in (folder, tls.ca_file.parent)] == ["0o700", "0o700"]
    assert {oct(p.stat().st_mode & 0o777) for p in (tls.ca_file, tls.cert, tls.key)} == {"0o600"}

    attacker = as_other_user(other_user, DASK_IMPORTS, DASK_ATTACK, {
        "folder": str(folder), "port": record.port, "timeout": ATTEMPT_TIMEOUT,
        "worker": worker_address,
    })
    results = outcome_of(attacker)
    assert [results.pop(name) for name in ("list the cluster's folder", "read the cluster's key",
                                           "rewrite the list of workers")] == ["PermissionError"] * 3
    assert results == dict.fromkeys(
        ("Client over tcp://", "Client over tls:// with its own certificate", "call a worker directly"), "refused")
    # Still serving its owner, with the same worker, which its list still names.
    assert list(scheduler_workers(record.address, folder)) == [record.workers[0].name]
    assert local_backend.get_state(ref).ready_workers == 1


def _worker_address(scheduler: str, folder: Path) -> str:
    from distributed import Client

    with Client(scheduler, timeout=10, security=DaskTls.of(folder).security()) as client:
        return next(iter(client.scheduler_info()["workers"]))


# ------------------------------------------------------------------ Ray

SQUATTER = """
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    print(json.dumps({"port": server.getsockname()[1]}), flush=True)
    received, connections = [], []

    def take(peer):
        connections.append(1)
        peer.settimeout(5)
        try:
            while True:
                chunk = peer.recv(65536)
                if not chunk:
                    break
                received.append(chunk.decode("latin-1"))
        except OSError:
            pass
        peer.close()

    ready = selectors.DefaultSelector()
    ready.register(server, selectors.EVENT_READ)
    ready.register(sys.stdin, selectors.EVENT_READ)
    while not any(key.fileobj is sys.stdin for key, _ in ready.select()):
        take(server.accept()[0])
    # The owner closes stdin once every connection it makes is made: take those still queued too.
    server.setblocking(False)
    while True:
        try:
            peer, _ = server.accept()
        except BlockingIOError:
            break
        take(peer)
    server.close()
    print(json.dumps({"connections": len(connections), "received": "".join(received)}), flush=True)
"""


def test_a_port_squatter_of_another_user_receives_no_ray_token(other_user, tmp_path, monkeypatch):
    token_path = tmp_path / ray_ops.TOKEN_FILE
    token = ray_ops.new_token(token_path).read_text()
    squatter = as_other_user(other_user, "import selectors, socket", SQUATTER, {}, stdin=subprocess.PIPE)
    try:
        port = json.loads(squatter.stdout.readline())["port"]
        url = ray_ops.dashboard_url("127.0.0.1", port)
        # The local backend's readiness and worker count, and the framework check of a run holding the
        # cluster's connection variables: each reaches the port, and sends nothing there.
        assert ray_ops.alive_nodes(url, str(token_path)) is None
        assert ray_ops.alive_worker_nodes(url, str(token_path)) is None
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token_path))
        with pytest.raises(HeadUnreachable) as refused:
            read_registered(PROBES["ray"], Endpoint("ray", url, "test"), timeout=10)
        assert f"held by uid {other_user.pw_uid}, not by you: nothing sent" in str(refused.value)
    finally:
        found = outcome_of(squatter, stdin="")
    assert found["connections"] == 3, found
    assert token not in found["received"] and found["received"] == ""
    # The same reads of a dashboard of the owner's own carry the token and are answered.
    with RayDashboardServer(token=token) as head:
        nodes = ray_ops.alive_nodes(head.url, str(token_path))
    assert nodes is not None and [n["is_head_node"] for n in nodes] == [True]


RAY_SQUATTER_IMPORTS = """
    import pathlib, queue, shutil, tempfile, threading, time
    from concurrent import futures
    import grpc
    from flytekitplugins_ddlscale.backends.local._secrets import ensure_tls
    warm = tempfile.mkdtemp()
    ensure_tls(pathlib.Path(warm))
    shutil.rmtree(warm)
    # What grpc imports lazily, imported as the owner (the other user may not read the checkout's venv): a
    # server that starts and stops, and a call that fails.
    warm = grpc.server(futures.ThreadPoolExecutor(1), options=[("grpc.so_reuseport", 0)])
    warm.add_insecure_port("127.0.0.1:0")
    warm.start()
    warm.stop(0)
    with grpc.insecure_channel("127.0.0.1:9") as channel:
        try:
            channel.unary_unary("/warm/Up")(b"", timeout=0.2, metadata=[("authorization", "Bearer x")])
        except grpc.RpcError:
            pass
"""
RAY_SQUATTER = """
    calls, lock, servers = [], threading.Lock(), []

    class Record(grpc.GenericRpcHandler):
        # Whatever call arrives: its method and headers are kept, and it is answered UNAVAILABLE, as a GCS still
        # starting would be (the callers keep calling, and keep running).
        def service(self, details):
            with lock:
                calls.append([details.method, [[k, v if isinstance(v, str) else v.hex()]
                                               for k, v in details.invocation_metadata]])
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: context.abort(grpc.StatusCode.UNAVAILABLE, "starting"))

    def squat(port):
        # A plain gRPC server (HTTP/2 without TLS, as Ray's own are without it) takes the port the moment the
        # cluster's process lets it go.
        server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[Record()], options=[("grpc.so_reuseport", 0)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if server.add_insecure_port(f"127.0.0.1:{port}") == port:
                    server.start()
                    servers.append(server)
                    print(json.dumps({"bound": port}), flush=True)
                    return
            except RuntimeError:
                pass
            time.sleep(0.002)
        print(json.dumps({"bound": None}), flush=True)

    def tokens():
        with lock:
            caught = {value[len("Bearer "):] for _, headers in calls for key, value in headers
                      if key == "authorization" and value.startswith("Bearer ")}
        return sorted(caught)

    own = ensure_tls(pathlib.Path(tempfile.mkdtemp()))

    def node_stats(port, given, authority):
        # NodeManagerService/GetNodeStats on a port of a raylet (an empty request is a whole one), with the
        # token given (as if it had leaked) and each token caught: in plain gRPC, and over TLS trusting the
        # cluster's authority (a certificate is no secret) with a certificate of its own authority.
        answers = []
        for token in [*given, *tokens()]:
            for credentials in [None] + ([grpc.ssl_channel_credentials(
                    root_certificates=authority.encode(), private_key=own.key.read_bytes(),
                    certificate_chain=own.cert.read_bytes())] if authority else []):
                target = f"127.0.0.1:{port}"
                with (grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)) as channel:
                    try:
                        channel.unary_unary("/ray.rpc.NodeManagerService/GetNodeStats")(
                            b"", timeout=args["timeout"], metadata=[("authorization", f"Bearer {token}")])
                        answers.append("OK")
                    except grpc.RpcError as exc:
                        answers.append(exc.code().name)
        return answers

    def report():
        caught = tokens()
        with lock:
            print(json.dumps({"calls": len(calls), "first": calls[:3], "tokens": caught}), flush=True)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        if "squat" in order:
            threading.Thread(target=squat, args=(order["squat"],), daemon=True).start()
        elif "node_stats" in order:
            print(json.dumps({"node_stats": {str(p): node_stats(p, order.get("tokens", []), order.get("authority"))
                                             for p in order["node_stats"]}}), flush=True)
        elif "report" in order:
            report()
    for server in servers:
        server.stop(0)
    report()
"""


class Conversation:
    """Orders to the attacker (one JSON line each on its stdin) and its answers (JSON lines on its stdout)."""

    def __init__(self, process: "subprocess.Popen[str]") -> None:
        self.process = process
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def send(self, **order: Any) -> None:
        self.process.stdin.write(json.dumps(order) + "\n")
        self.process.stdin.flush()

    def expect(self, key: str, timeout: float = 90) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"the attacker said no {key!r} within {timeout:.0f}s:\n{self.process.stderr.read()[-3000:]}"
                            if self.process.poll() is not None else f"the attacker said no {key!r} within {timeout:.0f}s")
            answer = json.loads(line)
            if key in answer:
                return answer

    def close(self) -> Dict[str, Any]:
        self.process.stdin.close()
        answer = self.expect("calls")
        self.process.wait(timeout=60)
        return answer


def _gcs_server(record) -> "procs.ProcessId":
    """The gcs_server process of the head ``record`` holds."""
    (gcs,) = [p for p in procs.group_members(record.scheduler) if "gcs_server" in _cmdline(p.pid)]
    return gcs


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


def _raylet_ports(worker) -> List[int]:
    """The TCP ports the raylet of worker node ``worker`` (its record) listens on."""
    import psutil

    raylets = [p for p in procs.group_members(worker.proc) if "raylet/raylet" in _cmdline(p.pid)]
    assert raylets, f"no raylet in the process group of {worker.name}"
    return sorted({c.laddr.port for r in raylets for c in psutil.Process(r.pid).net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN})


@pytest.mark.slow
@pytest.mark.starts_ray
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="local Ray clusters need Ray installed")
def test_a_crashed_ray_head_gives_its_port_squatter_no_token_and_restart_and_repair_move_off_the_port(
        local_backend, other_user, tmp_path):
    """Issue 44: the head's gcs_server crashes and another user takes its port at once, with a gRPC server
    that keeps every call's headers. Before, the worker node (Ray's outlive their head by a minute) sent it
    ~1,500 calls a second, each with ``authorization: Bearer <token>``, and that token made a raylet answer
    the other user's GetNodeStats. Now no call reaches it (Ray's mutual TLS: nothing is sent before the
    listener shows the cluster's certificate), the worker node ends with its head, and no raylet answers
    another user even with the cluster's token. ``restart-head`` and ``status --repair`` then move the head
    to a new port, the squatter still holding the old one, and send it nothing either."""
    ref = ClusterRef("ray", "squatted")
    local_backend.up(ref, 1, "Tiny", timeout=180)
    record = local_backend.store.load(ref)
    token = Path(record.framework["auth_token_path"]).read_text().strip()
    (worker,) = record.workers
    raylet_ports = _raylet_ports(worker)
    assert raylet_ports
    attacker = Conversation(as_other_user(other_user, RAY_SQUATTER_IMPORTS, RAY_SQUATTER, {"timeout": ATTEMPT_TIMEOUT},
                                          stdin=subprocess.PIPE, bufsize=1))
    try:
        attacker.expect("ready")
        # Even the cluster's very token gets another user nothing from a raylet: no call in plain gRPC, nor
        # over TLS with a certificate of another authority (before TLS: OK, the node's stats).
        authority = Path(record.framework["tls_dir"], "ca.pem").read_text()
        attacker.send(node_stats=raylet_ports, tokens=[token], authority=authority)
        answers = attacker.expect("node_stats")["node_stats"]
        assert all(codes == ["UNAVAILABLE", "UNAVAILABLE"] for codes in answers.values()), answers

        # A crash of the GCS: the head's `ray start` ends the head node, and the worker node, which Ray keeps
        # calling the GCS port for a minute, ends with its head (its wrapper watches the head process).
        attacker.send(squat=record.port)
        os.kill(_gcs_server(record).pid, signal.SIGKILL)
        assert attacker.expect("bound")["bound"] == record.port
        time.sleep(2)  # before TLS, ~1,500 calls a second came, each with the token
        attacker.send(report=True)
        caught = attacker.expect("calls")
        assert (caught["calls"], caught["tokens"]) == (0, []), caught
        wait_dead(worker.proc, timeout=30)
        assert local_backend.get_state(ref).status == "Failed"

        # restart-head with the old GCS port still held: a new port, a new head, the same worker back.
        env = {**os.environ, "DDLSCALE_STATE_DIR": str(tmp_path), "DDLSCALE_LOCAL_TIERS": str(tmp_path / "tiers.yaml")}
        done = subprocess.run([DDLSCALE, "restart-head", "--backend", "local", "--kind", "ray", "--name", ref.name,
                               "--timeout", "180", "--json"], capture_output=True, text=True, timeout=240, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        moved = local_backend.store.load(ref)
        assert moved.port != record.port and json.loads(done.stdout)["final"]["ready_workers"] == 1
        assert [w.name for w in moved.workers] == [worker.name]

        # status --repair after another crash, the squatter taking that port too.
        attacker.send(squat=moved.port)
        os.kill(_gcs_server(moved).pid, signal.SIGKILL)
        assert attacker.expect("bound")["bound"] == moved.port
        time.sleep(2)
        done = subprocess.run([DDLSCALE, "local", "status", "--kind", "ray", "--name", ref.name, "--repair", "--json"],
                              capture_output=True, text=True, timeout=240, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        repaired = json.loads(done.stdout)
        assert (repaired["repaired"], repaired["status"], repaired["ready_workers"]) == (True, "Running", 1)
        final = local_backend.store.load(ref)
        assert final.port not in (record.port, moved.port)
    finally:
        if attacker.process.poll() is None:
            found = attacker.close()
        else:
            found = {"calls": None, "stderr": attacker.process.stderr.read()[-3000:]}
    assert (found["calls"], found["tokens"]) == (0, []), found
    assert token not in json.dumps(found)


def test_each_ray_head_start_writes_a_new_token_and_tells_worker_nodes_by_a_file(tmp_path, monkeypatch):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed")
    # The head's Ray temp folder (a mkdtemp one: the test's folder is too deep for Ray's sockets) goes there.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    from flytekitplugins_ddlscale.backends.local._ray_driver import TOKEN_PATH, RayDriver
    from flytekitplugins_ddlscale.backends.local._state import ClusterRecord, LocalStateStore

    store = LocalStateStore(tmp_path / "local")
    ref = ClusterRef("ray", "fresh")
    record = ClusterRecord(ref=ref, host="127.0.0.1", port=6380, ports={"dashboard": 1, "client": 2})
    driver = RayDriver()
    tokens = []
    for _ in range(2):
        argv = driver.head_argv(record, store)
        token_file = Path(record.framework[TOKEN_PATH])
        tokens.append(token_file.read_text())
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert not any(tokens[-1] in part for part in argv)
        ray_ops.mark_head_ready(store.cluster_dir(ref))
    assert tokens[0] != tokens[1] and all(len(t) == 64 for t in tokens)
    # A head start forgets that the previous head was ready; a worker node waits on that file only.
    driver.head_argv(record, store)
    ready = store.cluster_dir(ref) / ray_ops.HEAD_READY_FILE
    assert not ready.exists()
    worker = driver.worker_argv(record, "w-0", _shape(), store.private_cluster_dir(ref, "work"))
    assert worker[worker.index("--") - 1] == str(ready)
    assert not any("http://" in part for part in worker)


def _shape():
    from flytekitplugins_ddlscale.backends.local._tiers import WorkerShape

    return WorkerShape(tier="Tiny", nthreads=1, memory_limit=512 * 2**20)


# ------------------------------------------------------------------ Spark

def _spark_present() -> bool:
    java_home = os.environ.get("JAVA_HOME", "").strip()
    java = bool(java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK)) or shutil.which("java") is not None
    return java and importlib.util.find_spec("pyspark") is not None


SPARK_ATTACK = """
    import socket, struct
    results = {}
    for name, path in (("read the secret", args["secret"]), ("read the application defaults", args["defaults"])):
        try:
            open(path).read()
            results[name] = "read"
        except OSError as exc:
            results[name] = type(exc).__name__
    # One RPC request as a Spark client without the secret sends it first: frame length, type 3
    # (RpcRequest), request id, body length, then the body (a Java serialization header here).
    body = b"\\xac\\xed\\x00\\x05ddlscale"
    header = struct.pack(">bqi", 3, 42, len(body))
    connection = socket.create_connection(("127.0.0.1", args["port"]), timeout=30)
    connection.sendall(struct.pack(">q", 8 + len(header) + len(body)) + header + body)
    answer = b""
    while len(answer) < 8 or len(answer) < struct.unpack(">q", answer[:8])[0]:
        chunk = connection.recv(65536)
        if not chunk:
            break
        answer += chunk
    results["type"] = answer[8] if len(answer) > 8 else None
    results["answer"] = answer[21:4000].decode("utf-8", "replace")
    print(json.dumps(results))
"""


@pytest.mark.slow
@pytest.mark.starts_spark
@pytest.mark.skipif(not _spark_present(), reason="local Spark clusters need pyspark and Java 17+")
def test_a_local_spark_master_refuses_another_users_rpc(local_backend, other_user):
    ref = ClusterRef("spark", "guarded")
    local_backend.up(ref, 0, "Tiny", timeout=180)
    record = local_backend.store.load(ref)
    folder = local_backend.store.cluster_dir(ref)
    secret = folder / "spark-auth-secret"
    defaults = Path(record.framework["conf_dir"]) / "spark-defaults.conf"
    assert {oct(p.stat().st_mode & 0o777) for p in (secret, defaults, folder / "spark-daemon.conf")} == {"0o600"}
    assert f"spark.authenticate.secret {secret.read_text()}" in defaults.read_text()

    attacker = as_other_user(other_user, "import encodings.idna, socket, struct", SPARK_ATTACK, {
        "secret": str(secret), "defaults": str(defaults), "port": record.port,
    })
    results = outcome_of(attacker)
    assert (results["read the secret"], results["read the application defaults"]) == ("PermissionError", "PermissionError")
    # RpcFailure (type 5): the authentication handler of Spark's AES-based RPC encryption
    # (spark.network.crypto) refused a message that is no authentication.
    assert results["type"] == 5, results
    assert "Expected SaslMessage" in results["answer"], results["answer"]
    assert "org.apache.spark.network.crypto.AuthRpcHandler" in results["answer"], results["answer"]
