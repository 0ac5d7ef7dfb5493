"""Command lines that start local Ray nodes, and what the Ray head's dashboard says about them.

Nothing here imports ``ray``: nodes are ``ray start --block`` processes of the Ray beside this Python (or
``$DDLSCALE_RAY_EXECUTABLE``), run through :mod:`._ray_node`, held to loopback, with Ray's token
authentication and its mutual TLS (:func:`tls_env`); the dashboard is read only once its port is proven
this user's (:func:`~flytekitplugins_ddlscale._core.peerowner.own_peer_opener`). docs/local.md, Security.
"""
import contextlib
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from ...errors import UnsupportedOperationError
from ..._framework.probes import PROBES, ray_alive_nodes
from ..._core import settings
from ..._core.peerowner import own_peer_opener
from ..._framework.probes import ray_auth_headers
from ..._core.waiting import probe_timeout
from .._support.privatefs import private_dir, remove_nofollow
from ._secrets import DaskTls, fresh_secret
from ._procs import with_environment
from ._tiers import WorkerShape

INSTALL_HINT = 'install the package with its "ray" extra and the constraints (in a clone: uv pip install -c constraints.txt -e ".[ray]"; a wheel: "flytekitplugins_ddlscale-*.whl[ray]")'
OBJECT_STORE_SHARE = 0.3
"""Share of a tier's memory given to the node's object store, as Ray itself does (the rest is ``--memory``)."""
OBJECT_STORE_MINIMUM = 75 * 1024 * 1024
"""Ray refuses an object store below 75 MiB."""
HEAD_OBJECT_STORE = 256 * 1024 * 1024
"""The head runs no tasks (``--num-cpus 0``); its store holds what ``ray://`` clients put."""
TOKEN_FILE = "ray-auth-token"
"""The cluster's Ray authentication token, in the cluster's folder (mode 0600)."""
HEAD_READY_FILE = "ray-head-ready"
"""In the cluster's folder once its head node has joined: removed before a head starts, written by the
first readiness check whose dashboard read (this user's dashboard, proven) lists the head node ALIVE,
which may be before the client server answers; worker nodes (:mod:`.ray_node`) start once it is there."""
_OPENER = own_peer_opener()
NODE_PROGRAM = Path(__file__).with_name("_ray_node.py")
"""What every node runs as (:mod:`.ray_node`): ``ray start`` held to loopback, and a worker's wrapper."""
LOOPBACK_CLUSTER_ENV = settings.RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER.name
"""Set to 0 for every process of a node: Ray's address look-ups then answer loopback (see
:mod:`.ray_node`, which keeps ``ray start`` itself able to join a head)."""


def ray_executable() -> str:
    """The ``ray`` command nodes start with: ``$DDLSCALE_RAY_EXECUTABLE``, else the one beside this Python,
    else the first on ``PATH``; :class:`UnsupportedOperationError` saying how to install Ray when none."""
    configured = settings.RAY_EXECUTABLE.value() or ""
    if configured:
        candidates = [configured]
    else:
        candidates = [str(Path(sys.executable).parent / "ray"), shutil.which("ray") or ""]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    where = f"${settings.RAY_EXECUTABLE.name}={configured} is not an executable file" if configured else (
        f"no `ray` command beside {sys.executable} or on PATH"
    )
    raise UnsupportedOperationError(
        f"local Ray clusters need Ray installed in this environment: {INSTALL_HINT} "
        f"({where}; ${settings.RAY_EXECUTABLE.name} may name the `ray` command of another installation)"
    )


RAY_TEMP_PREFIX = "ddlscale-ray-"
"""Name prefix of a Ray temp folder made with ``mkdtemp`` when the cluster's folder is too deep for Ray's sockets."""
SOCKET_PATH_MAX = 107
"""Bytes a Unix socket path may have."""
BELOW_TEMP_DIR = len("/r/w12345678/session_2026-01-31_12-00-00_123456_4194304/sockets/plasma_store")
"""Bytes Ray adds below a cluster's private temp folder for its longest socket: Ray's own folder
(:func:`ray_temp_dir`), a worker node's (:func:`worker_temp_dir`), the session folder (date,
microseconds, a pid of up to 7 digits), the socket."""


def ray_python(ray: str) -> str:
    """The Python of the ``ray`` command (this one when beside it, else its ``#!`` line's), which runs
    :mod:`.ray_node`; :class:`UnsupportedOperationError` when ``ray`` is not a Python console script."""
    if Path(ray).parent == Path(sys.executable).parent:
        return sys.executable
    try:
        with open(ray, "rb") as script:
            first = script.readline(512).decode("utf-8", "replace")
    except OSError as exc:
        first = f"({exc})"
    words = first[2:].split() if first.startswith("#!") else []
    if len(words) > 1 and Path(words[0]).name == "env":
        words = [shutil.which(words[1]) or words[1]]
    interpreter = words[0] if words else ""
    if "python" in Path(interpreter).name and os.access(interpreter, os.X_OK):
        return interpreter
    raise UnsupportedOperationError(
        f"local Ray clusters start their nodes through the Python of the `ray` command, and {ray} does "
        f"not name one on its #! line ({first.strip()[:80]!r}); set ${settings.RAY_EXECUTABLE.name} to the `ray` "
        f"console script of a Python installation ({INSTALL_HINT})"
    )


def new_token(path: Path) -> Path:
    """A new random token (256 bits) in the cluster's token file ``path`` (0600), replacing the last
    head's: a head start makes any token seen before it worthless. Clients hold the path, not the token."""
    fresh_secret(path)
    return path


def head_starting(cluster_dir: Path) -> None:
    """Forget that a previous head was ready (:data:`HEAD_READY_FILE`): worker nodes wait for this one."""
    remove_nofollow(cluster_dir / HEAD_READY_FILE)


def mark_head_ready(cluster_dir: Path) -> None:
    """Tell the worker nodes waiting in :mod:`.ray_node` that the head node has joined (:data:`HEAD_READY_FILE`);
    nothing when the cluster's folder is gone (taken down meanwhile)."""
    ready = cluster_dir / HEAD_READY_FILE
    if not os.path.lexists(ready):
        with contextlib.suppress(FileNotFoundError):
            os.close(os.open(ready, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


def tls_env(tls: Optional[DaskTls]) -> Dict[str, str]:
    """Ray's mutual TLS on every gRPC channel with the cluster's own authority (:func:`~._secrets.ensure_tls`):
    every server asks for its certificate and every client checks the server's before a byte of a call (and
    its token) leaves; nothing for ``None`` (a head started before TLS speaks plain gRPC)."""
    if tls is None:
        return {}
    return {
        settings.RAY_USE_TLS.name: "1",
        settings.RAY_TLS_CA_CERT.name: str(tls.ca_file),
        settings.RAY_TLS_SERVER_CERT.name: str(tls.cert),
        settings.RAY_TLS_SERVER_KEY.name: str(tls.key),
    }


def node_env(token_path: str, tls: Optional[DaskTls] = None) -> Dict[str, str]:
    """What every process of a node runs with: loopback address look-ups, token authentication and the
    cluster's TLS (:func:`tls_env`)."""
    return {
        LOOPBACK_CLUSTER_ENV: "0", settings.RAY_AUTH_MODE.name: "token", settings.RAY_AUTH_TOKEN_PATH.name: token_path,
        **tls_env(tls),
    }


def client_env(token_path: str, tls: Optional[DaskTls] = None) -> Dict[str, str]:
    """What user code needs to connect (``ray.init("ray://...")``) and the framework check to read
    the dashboard: token authentication and the token file's path (never the token), and the cluster's
    TLS (:func:`tls_env`: the client server speaks nothing else)."""
    return {settings.RAY_AUTH_MODE.name: "token", settings.RAY_AUTH_TOKEN_PATH.name: token_path, **tls_env(tls)}


def temp_dir(cluster_dir: Path) -> str:
    """A new cluster's private folder (0700) of Ray files: ``<cluster folder>/ray`` when Ray's sockets fit
    their 107-byte limit there, else a ``mkdtemp`` folder ``ddlscale-ray-XXXXXXXX``; the caller records it."""
    inside = cluster_dir / "ray"
    if len(os.fsencode(str(inside))) + BELOW_TEMP_DIR <= SOCKET_PATH_MAX:
        return str(private_dir(inside))
    return tempfile.mkdtemp(prefix=RAY_TEMP_PREFIX)


def ray_temp_dir(folder: str) -> str:
    """Ray's ``--temp-dir`` inside the private ``folder``: Ray makes its temp folder and session folders
    0777, so they stay private only below a folder of ours."""
    return str(Path(folder) / "r")


def _start(python: str) -> List[str]:
    """The ``ray`` command as nodes run it: :mod:`.ray_node` ``start`` in Ray's Python (:func:`ray_python`),
    which holds the node to loopback."""
    return [python, str(NODE_PROGRAM)]


@dataclass(frozen=True)
class RayNodes:
    """What every node of one local Ray cluster starts with: Ray's Python (:func:`ray_python`), the loopback
    host, the GCS port, Ray's ``--temp-dir`` (:func:`ray_temp_dir`), the token file and the cluster's TLS
    files (None for a head started before local Ray spoke TLS)."""

    python: str
    host: str
    port: int
    temp: str
    token_path: str
    tls: Optional[DaskTls] = None

    def env(self) -> Dict[str, str]:
        """What every process of a node runs with (:func:`node_env`)."""
        return node_env(self.token_path, self.tls)


def head_argv(nodes: RayNodes, dashboard_port: int, client_port: int) -> List[str]:
    """``ray start --head --block``: the GCS on the cluster's port, the dashboard and the client server on
    theirs, all on loopback. Every port Ray would take at a fixed default is given, so clusters run side by
    side (the rest are the OS's: port 0); the head runs no tasks. ``GRPC_ENABLE_FORK_SUPPORT=0``: with
    gRPC's fork handlers on, the client server's first per-client server often died of SIGSEGV before exec
    (4 of 5 first ``ray://`` connections refused, 0 of 7 with them off)."""
    return with_environment({"GRPC_ENABLE_FORK_SUPPORT": "0", **nodes.env()}, [
        *_start(nodes.python), "start", "--head", "--block",
        "--node-ip-address", nodes.host,
        "--port", str(nodes.port),
        "--dashboard-host", nodes.host,
        "--dashboard-port", str(dashboard_port),
        "--ray-client-server-port", str(client_port),
        "--dashboard-agent-listen-port", "0",
        "--num-cpus", "0",
        "--num-gpus", "0",
        "--object-store-memory", str(HEAD_OBJECT_STORE),
        "--temp-dir", nodes.temp,
        "--disable-usage-stats",
    ])


def worker_argv(
    nodes: RayNodes, name: str, shape: WorkerShape, ready_file: str, head: Optional[Tuple[int, int]] = None
) -> List[str]:
    """One worker node named ``name`` (its Ray ``node_name``) of ``shape``, under :mod:`.ray_node`'s wrapper:
    it starts once ``ready_file`` (:data:`HEAD_READY_FILE`) is there and stops once the head process ``head``
    (pid, start time) is gone. Its ``--temp-dir`` is its own (:func:`worker_temp_dir`): nodes sharing one
    session folder picked the same socket name when starting at once (one raylet died)."""
    store = max(OBJECT_STORE_MINIMUM, int(shape.memory_limit * OBJECT_STORE_SHARE))
    return with_environment(nodes.env(), [
        sys.executable, str(NODE_PROGRAM), ready_file,
        *(["--head", f"{head[0]}:{head[1]}"] if head is not None else []), "--",
        *_start(nodes.python), "start", "--block",
        "--address", f"{nodes.host}:{nodes.port}",
        "--node-ip-address", nodes.host,
        "--node-name", name,
        "--num-cpus", str(shape.nthreads),
        "--num-gpus", "0",
        "--memory", str(max(shape.memory_limit - store, OBJECT_STORE_MINIMUM)),
        "--object-store-memory", str(store),
        "--dashboard-agent-listen-port", "0",
        "--temp-dir", worker_temp_dir(nodes.temp, name),
        "--disable-usage-stats",
    ])


def worker_temp_dir(temp: str, name: str) -> str:
    """Worker node ``name``'s ``--temp-dir`` in ``temp``: short (``w`` and 8 hex digits), as its sockets go three
    levels below it and a Unix socket path has 107 bytes at most."""
    return str(Path(temp) / f"w{hashlib.sha1(name.encode()).hexdigest()[:8]}")


def dashboard_url(host: str, port: int) -> str:
    """The dashboard's base URL."""
    return f"http://{host}:{port}"


def alive_nodes(base_url: str, token_path: str, timeout: float = 3.0) -> Optional[List[Dict[str, Any]]]:
    """Every ALIVE node (head included) the dashboard at ``base_url`` lists, read with the cluster's token;
    None while it does not answer with a node list, or another user holds its port (nothing sent then)."""
    headers = {"Accept": "application/json", **ray_auth_headers(client_env(token_path))}
    request = urllib.request.Request(PROBES["ray"].url(base_url), headers=headers)
    try:
        with _OPENER.open(request, timeout=probe_timeout(timeout, f"the check of {base_url}")) as reply:
            return ray_alive_nodes(json.loads(reply.read().decode("utf-8")))
    except (OSError, ValueError):
        # URLError, refused or reset connections, timeouts and a port held by another user are
        # OSErrors; a dashboard still starting answers 5xx (HTTPError, an OSError) or another shape.
        return None


def accepts_connections(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something listens on ``host:port`` (a TCP connection is accepted, then closed)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def alive_worker_nodes(base_url: str, token_path: str, timeout: float = 3.0) -> Optional[Set[str]]:
    """``node_name`` of every ALIVE worker node (not the head) the dashboard at ``base_url`` lists;
    None while it does not answer with a node list."""
    nodes = alive_nodes(base_url, token_path, timeout)
    if nodes is None:
        return None
    return {str(n.get("node_name")) for n in nodes if not n.get("is_head_node")}
