"""Running a local Spark standalone cluster: the installation it needs, command lines, the master's JSON.
Nothing here imports ``pyspark``: ``bin/spark-class`` of the distribution runs each daemon in the foreground
(the recorded pid is the JVM), and the master is read over its web UI's ``/json/``."""
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Set

from ..._core import settings
from ..._core.waiting import probe_timeout
from ...errors import UnsupportedOperationError
from .._support.privatefs import private_dir
from ._procs import python_module, with_environment

MIN_JAVA = 17
"""Spark 4 runs on Java 17 or newer."""
INSTALL_PYSPARK = 'install the package with its "spark" extra and the constraints (in a clone: uv pip install -c constraints.txt -e ".[spark]"; a wheel: "flytekitplugins_ddlscale-*.whl[spark]")'
INSTALL_JAVA = "Java 17 or newer (e.g. `apt-get install openjdk-17-jre-headless`), or set JAVA_HOME to one"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DAEMON_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The master, the workers and spark-class's launcher mostly start up and then idle: without
the optimising compiler and with one GC thread a worker joined in 5 s instead of 15-20 s on
the busy 2-core machine (3 alternating runs each). Executors are unaffected."""
MASTER_WAIT = 120
"""Seconds a new worker waits for its master to answer before it starts anyway."""

_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def spark_home() -> Path:
    """The pyspark distribution's folder (``bin/spark-class``, ``jars/``); :class:`UnsupportedOperationError`
    saying what to install without pyspark."""
    spec = importlib.util.find_spec("pyspark")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    home = Path(locations[0]) if locations else None
    if home is None or not (home / "bin" / "spark-class").is_file():
        raise UnsupportedOperationError(
            f"local Spark clusters need pyspark, which is not installed here: {INSTALL_PYSPARK}"
        )
    return home


def java_command(env: Optional[Mapping[str, str]] = None) -> str:
    """The ``java`` ``spark-class`` runs (``$JAVA_HOME/bin/java``, else ``java`` on PATH), checked to be Java 17+;
    :class:`UnsupportedOperationError` saying what to install otherwise."""
    java_home = settings.JAVA_HOME.value(env=env)
    # Given no path, shutil.which searches this process's PATH.
    search = env.get("PATH") if env is not None else None
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java", path=search)
    where = f"$JAVA_HOME/bin/java ({java})" if java_home else "java on PATH"
    if not java or not os.access(java, os.X_OK):
        raise UnsupportedOperationError(f"local Spark clusters need Java, and there is no {where}: install {INSTALL_JAVA}")
    try:
        major = _version_of(java, os.stat(java).st_mtime_ns)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UnsupportedOperationError(f"{where} does not run ({exc}): install {INSTALL_JAVA}") from None
    if major is None or major < MIN_JAVA:
        found = f"Java {major}" if major is not None else "no Java version in its `-version` output"
        raise UnsupportedOperationError(
            f"local Spark clusters need Java {MIN_JAVA}+, but {where} is {found}: install {INSTALL_JAVA}"
        )
    return java


@functools.lru_cache(maxsize=8)
def _version_of(java: str, mtime_ns: int) -> Optional[int]:
    """The major version ``java -version`` shows, asked once per binary (and modification time) per
    process: each backend object checks Java, and the JVM takes a second to answer."""
    shown = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    return java_major(shown.stderr + shown.stdout)


def java_major(version_text: str) -> Optional[int]:
    """The major version in ``java -version`` output (``"1.8.0_392"`` is 8, ``"17.0.15"`` is 17)."""
    match = _JAVA_VERSION.search(version_text)
    if match is None:
        return None
    first, second = int(match.group(1)), match.group(2)
    return int(second) if first == 1 and second is not None else first


def scratch_option(scratch: Path) -> str:
    """The JVM option that keeps a Spark process's temporary files (native libraries it unpacks, its
    own temporary folders) in ``scratch`` instead of the system's temporary folder, which every local
    user can list; quoted, as Spark splits option strings on spaces."""
    return f'"-Djava.io.tmpdir={scratch}"'


@dataclass(frozen=True)
class SparkCluster:
    """What every daemon of one local Spark cluster starts with: the installation, the configuration
    folder (``spark-defaults.conf``) and the daemons' properties file, the loopback host, the master's
    ports and the cluster's private scratch folder."""

    home: Path
    conf_dir: Path
    daemon_conf: Path
    host: str
    port: int
    webui_port: int
    scratch: Path

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"


def _launch(cluster: SparkCluster, main_class: str) -> List[str]:
    """``spark-class main_class`` in the foreground (``env`` and ``spark-class`` exec: the recorded pid is the
    JVM's), its RPC endpoints and web UI held to the cluster's host (``SPARK_LOCAL_IP``), its local dirs and
    temporary files in the private scratch folder (Spark makes executors' folders 0755), the launcher and
    daemon JVMs with :data:`DAEMON_JVM_OPTIONS` ahead of any options already set (later ones win)."""
    scratch = cluster.scratch
    return with_environment(
        {
            settings.SPARK_HOME.name: str(cluster.home),
            settings.SPARK_CONF_DIR.name: str(cluster.conf_dir),
            settings.SPARK_LOCAL_IP.name: cluster.host,
            settings.SPARK_LOCAL_DIRS.name: str(scratch),
            settings.SPARK_LAUNCHER_OPTS.name: f"{DAEMON_JVM_OPTIONS} {settings.SPARK_LAUNCHER_OPTS.value()}".rstrip(),
            settings.SPARK_DAEMON_JAVA_OPTS.name:
                f"{DAEMON_JVM_OPTIONS} {scratch_option(scratch)} {settings.SPARK_DAEMON_JAVA_OPTS.value()}".rstrip(),
        },
        [str(cluster.home / "bin" / "spark-class"), main_class],
    )


def master_argv(cluster: SparkCluster) -> List[str]:
    """The standalone master on the cluster's port, its web UI on its web UI port."""
    return [
        *_launch(cluster, MASTER_CLASS),
        "--host", cluster.host,
        "--port", str(cluster.port),
        "--webui-port", str(cluster.webui_port),
        "--properties-file", str(cluster.daemon_conf),
    ]


def worker_argv(
    cluster: SparkCluster, port: int, webui_port: int, cores: int, memory_mib: int, work_dir: Path
) -> List[str]:
    """One standalone worker on ``port`` offering ``cores`` and ``memory_mib`` MiB to executors. It starts once
    the master's web UI answers (:func:`main`), so it registers on its first try: a standalone worker tries
    at once, then only every 5 to 15 s."""
    return [
        *python_module(__name__),
        cluster.webui_url, str(MASTER_WAIT), "--",
        *_launch(cluster, WORKER_CLASS),
        cluster.master_url,
        "--host", cluster.host,
        "--port", str(port),
        "--webui-port", str(webui_port),
        "--cores", str(cores),
        "--memory", f"{memory_mib}m",
        "--work-dir", str(work_dir),
        "--properties-file", str(cluster.daemon_conf),
    ]


SECRET_FILE = "spark-auth-secret"
"""The cluster's shared secret (``spark.authenticate.secret``), in the cluster's folder (0600)."""


def auth_properties(secret: str) -> Dict[str, str]:
    """Spark's own authentication on every connection (master, workers, executors, the application's driver):
    a peer without the cluster's ``secret`` is refused, and RPC and block transfers are encrypted (AES)."""
    return {
        "spark.authenticate": "true",
        "spark.authenticate.secret": secret,
        "spark.network.crypto.enabled": "true",
    }


def daemon_properties(secret: str) -> Dict[str, str]:
    """What the master and workers run with: :func:`auth_properties`; decommissioning on SIGPWR; a taken port
    fails the process (workers are told apart by port) instead of moving; and no HTTP request changes the
    cluster (the unauthenticated web UIs offer no kill or decommission, and there is no REST server)."""
    return {
        "spark.decommission.enabled": "true",
        "spark.port.maxRetries": "0",
        "spark.master.rest.enabled": "false",
        "spark.ui.killEnabled": "false",
        "spark.master.ui.decommission.allow.mode": "DENY",
        **auth_properties(secret),
    }


def app_properties(
    master_url: str, host: str, executor_memory_mib: int, python: str, secret: str, scratch: Path
) -> Dict[str, str]:
    """What an application finds in ``spark-defaults.conf``, as Domino presets it: ``spark.master``; executors
    that fit one worker of the tier; the driver reached and listening on ``host``; ``python`` (with pyspark)
    for Python tasks; decommissioned executors moving their blocks; the cluster's ``secret``
    (:func:`auth_properties`: the file is 0600, so only its owner's applications read it); scratch space and
    temporary files in the private ``scratch`` (a default JVM option, kept by an application's own); no kill
    from the driver's web UI."""
    return {
        "spark.master": master_url,
        "spark.driver.host": host,
        "spark.driver.bindAddress": host,
        "spark.ui.killEnabled": "false",
        "spark.executor.memory": f"{executor_memory_mib}m",
        "spark.pyspark.python": python,
        "spark.decommission.enabled": "true",
        "spark.storage.decommission.enabled": "true",
        "spark.local.dir": str(scratch),
        "spark.driver.defaultJavaOptions": scratch_option(scratch),
        "spark.executor.defaultJavaOptions": scratch_option(scratch),
        **auth_properties(secret),
    }


def write_properties(path: Path, values: Mapping[str, str]) -> None:
    """Write ``values`` as a Spark properties file (``key value`` lines), replacing it atomically."""
    private_dir(path.parent)
    text = "# Written by flytekitplugins-ddlscale for a local Spark cluster.\n" + "".join(
        f"{key} {value}\n" for key, value in values.items()
    )
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def master_json(webui_url: str, timeout: float = 3.0) -> Optional[Dict[str, Any]]:
    """The master's ``/json/`` status, or None when it does not answer with one."""
    try:
        with urllib.request.urlopen(f"{webui_url}/json/", timeout=probe_timeout(timeout, f"the check of {webui_url}")) as reply:
            payload = json.loads(reply.read().decode("utf-8"))
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return payload if isinstance(payload, dict) and isinstance(payload.get("workers"), list) else None


def workers_in(payload: Mapping[str, Any], states: Set[str]) -> Dict[str, Dict[str, Any]]:
    """The master's worker entries whose ``state`` is in ``states``, by ``host:port``."""
    return {
        f"{w.get('host')}:{w.get('port')}": w
        for w in payload.get("workers", [])
        if isinstance(w, dict) and w.get("state") in states
    }


def main(argv: List[str]) -> None:
    """``python -m <this module> URL SECONDS -- ARGV...``: wait at most ``SECONDS`` until the master's web UI
    at ``URL`` reports it ALIVE, then ``exec`` ``ARGV`` (the recorded pid becomes the worker's); past
    ``SECONDS`` start it anyway and leave the rest to the worker's retries and the caller's wait."""
    url, wait, separator, *command = argv
    if separator != "--" or not command:
        raise SystemExit("usage: _spark_ops URL SECONDS -- COMMAND...")
    deadline = time.monotonic() + float(wait)
    while time.monotonic() < deadline:
        status = master_json(url, timeout=1.0)
        if status is not None and status.get("status") == "ALIVE":
            break
        time.sleep(0.1)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
