"""Where a run's Spark master is: ``spark.master`` as Domino presets it in the Spark configuration.

Domino does not export the master's address as an environment variable; it
writes ``spark.master`` (``spark://<host>:7077``) into the run's Spark
configuration. This module reads it the way Spark does: ``$SPARK_MASTER``
if set, else ``spark-defaults.conf`` in ``$SPARK_CONF_DIR`` when that is
set, else in ``$SPARK_HOME/conf``.
"""
import re
from pathlib import Path
from typing import Mapping, Optional, Tuple

from .._core import settings

DEFAULTS_FILE = "spark-defaults.conf"
_SEPARATOR = re.compile(r"\s*[=:\s]\s*")


def read_properties(text: str) -> dict:
    """Key/value pairs of a Java-properties style file (``key value``, ``key=value`` or ``key: value``)."""
    values = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        parts = _SEPARATOR.split(line, maxsplit=1)
        values[parts[0]] = parts[1].strip() if len(parts) > 1 else ""
    return values


def master_host(master: str) -> Optional[str]:
    """The host of a standalone master URL (``spark://h:7077``, first of ``spark://h1:7077,h2:7077``).

    None for masters without a standalone master web UI (``local[*]``, ``yarn``, ``k8s://...``).
    """
    text = master.strip()
    if not text.startswith("spark://"):
        return None
    first = text[len("spark://"):].split(",")[0]
    host = first.rsplit(":", 1)[0] if ":" in first else first
    return host.strip("[]") or None


def configured_master(env: Mapping[str, str]) -> Optional[Tuple[str, str]]:
    """``(master URL, where it was found)`` from the environment or ``spark-defaults.conf``; None if unset."""
    master = settings.SPARK_MASTER.raw(env)
    if master:
        return master, f"${settings.SPARK_MASTER.name}"
    # As Spark itself: $SPARK_CONF_DIR replaces $SPARK_HOME/conf, it does not add to it.
    conf_dir, home = settings.SPARK_CONF_DIR.raw(env), settings.SPARK_HOME.raw(env)
    if conf_dir:
        path = Path(conf_dir) / DEFAULTS_FILE
    elif home:
        path = Path(home) / "conf" / DEFAULTS_FILE
    else:
        return None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    master = read_properties(text).get("spark.master")
    return (master, f"spark.master in {path}") if master else None
