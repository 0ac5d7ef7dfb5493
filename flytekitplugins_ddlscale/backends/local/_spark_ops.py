"""Running a local Spark standalone cluster: the installation it needs, command lines, the master's JSON.

Nothing here imports ``pyspark``: the distribution is located on disk (its
``bin/spark-class`` starts the master and workers in the foreground, so the
recorded pid is the JVM itself) and the master is read over its web UI's
``/json/`` with the standard library.
"""
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
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
    """The pyspark distribution's folder (with ``bin/spark-class`` and ``jars/``).

    Raises :class:`UnsupportedOperationError` saying what to install when pyspark is missing.
    """
    spec = importlib.util.find_spec("pyspark")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    home = Path(locations[0]) if locations else None
    if home is None or not (home / "bin" / "spark-class").is_file():
        raise UnsupportedOperationError(
            f"local Spark clusters need pyspark, which is not installed here: {INSTALL_PYSPARK}"
        )
    return home


def java_command(env: Optional[Mapping[str, str]] = None) -> str:
    """The ``java`` that ``spark-class`` will run (``$JAVA_HOME/bin/java``, else ``java`` on PATH),
    after checking it is Java 17 or newer.

    Raises :class:`UnsupportedOperationError` saying what to install when Java is missing or too old.
    """
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


def _launch(home: Path, conf_dir: Path, host: str, scratch: Path, main_class: str) -> List[str]:
    """``spark-class main_class`` with the environment every process of the cluster shares.

    ``env`` and ``spark-class`` both exec, so the pid the supervisor records is the JVM's.
    ``SPARK_LOCAL_IP`` binds the web UIs and the RPC endpoints to ``host`` instead of every
    interface. ``SPARK_LOCAL_DIRS`` and the daemons' temporary folder are the cluster's private
    ``scratch``: a worker makes its executors' shuffle and block folders there (0755 by Spark,
    so under /tmp another user could read an application's data). The launcher and daemon JVMs run
    with :data:`DAEMON_JVM_OPTIONS` ahead of any options already set (later ones win).
    """
    return with_environment(
        {
            settings.SPARK_HOME.name: str(home),
            settings.SPARK_CONF_DIR.name: str(conf_dir),
            settings.SPARK_LOCAL_IP.name: host,
            settings.SPARK_LOCAL_DIRS.name: str(scratch),
            settings.SPARK_LAUNCHER_OPTS.name: f"{DAEMON_JVM_OPTIONS} {settings.SPARK_LAUNCHER_OPTS.value()}".rstrip(),
            settings.SPARK_DAEMON_JAVA_OPTS.name:
                f"{DAEMON_JVM_OPTIONS} {scratch_option(scratch)} {settings.SPARK_DAEMON_JAVA_OPTS.value()}".rstrip(),
        },
        [str(home / "bin" / "spark-class"), main_class],
    )


def master_argv(
    home: Path, conf_dir: Path, daemon_conf: Path, host: str, port: int, webui_port: int, scratch: Path
) -> List[str]:
    """The standalone master on ``host:port``, its web UI on ``webui_port``, its temporary files in ``scratch``."""
    return [
        *_launch(home, conf_dir, host, scratch, MASTER_CLASS),
        "--host", host,
        "--port", str(port),
        "--webui-port", str(webui_port),
        "--properties-file", str(daemon_conf),
    ]


def worker_argv(
    home: Path, conf_dir: Path, daemon_conf: Path, master_url: str, master_webui: str, host: str, port: int,
    webui_port: int, cores: int, memory_mib: int, work_dir: Path, scratch: Path,
) -> List[str]:
    """One standalone worker on ``host:port`` offering ``cores`` and ``memory_mib`` MiB to executors, their
    scratch space in ``scratch``.

    It starts once the master at ``master_webui`` answers (at most :data:`MASTER_WAIT` s later;
    see :mod:`.spark_launch`), so it registers on its first try.
    """
    return [
        *python_module("flytekitplugins_ddlscale.backends.local._spark_launch"),
        master_webui, str(MASTER_WAIT), "--",
        *_launch(home, conf_dir, host, scratch, WORKER_CLASS),
        master_url,
        "--host", host,
        "--port", str(port),
        "--webui-port", str(webui_port),
        "--cores", str(cores),
        "--memory", f"{memory_mib}m",
        "--work-dir", str(work_dir),
        "--properties-file", str(daemon_conf),
    ]


SECRET_FILE = "spark-auth-secret"
"""The cluster's shared secret (``spark.authenticate.secret``), in the cluster's folder (0600)."""


def auth_properties(secret: str) -> Dict[str, str]:
    """Spark's own authentication, required of every connection to the master, the workers, the
    executors and the application's driver: a peer without the cluster's ``secret`` is refused (a
    standalone master would otherwise run any application, or a driver's code, submitted to it), and
    RPC and block transfers are encrypted (AES, ``spark.network.crypto``)."""
    return {
        "spark.authenticate": "true",
        "spark.authenticate.secret": secret,
        "spark.network.crypto.enabled": "true",
    }


def daemon_properties(secret: str) -> Dict[str, str]:
    """What the master and workers run with: :func:`auth_properties` of the cluster's ``secret``.

    Decommissioning lets a worker leave cleanly on SIGPWR. A port that is taken fails the
    process instead of moving to the next one, because workers are told apart by the port
    they were given, and the master must be where its record says. No HTTP request changes
    the cluster: the web UIs answer without authentication (the readiness checks read the
    master's ``/json/``), so they offer no kill (``spark.ui.killEnabled``) and the master refuses
    to decommission workers (``/workers/kill``, allowed from loopback by default), and the
    master runs no REST submission server.
    """
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
    """What an application finds in ``spark-defaults.conf``, as Domino presets it for a run.

    ``spark.master`` is how code written for Domino finds its cluster; executors fit in one
    worker of the cluster's tier; the driver is reached on ``host`` and listens there only
    (its web UI follows ``$SPARK_LOCAL_IP``: ``SparkDriver.connection_env``); Python tasks
    of ``spark-submit`` applications run with ``python`` (the interpreter that started the
    cluster, where pyspark is installed); decommissioned executors move their blocks to the
    remaining ones; the cluster's ``secret`` authenticates it (:func:`auth_properties`: the file is
    0600 in the cluster's private folder, so only its owner's applications can read it); the driver
    and the executors keep their scratch space and temporary files in the cluster's private
    ``scratch`` (Spark makes them readable by every user, under /tmp by default). That JVM option is
    a default option (Spark puts it before the application's own ``extraJavaOptions``), so an
    application that sets its own JVM options keeps it. The driver's web UI, which any local user
    can reach, offers no kill of jobs or stages (``spark.ui.killEnabled``).
    """
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
