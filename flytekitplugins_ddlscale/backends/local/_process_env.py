"""The environment every process of a local cluster starts with: a short allow-list, never credentials.

Local clusters run code sent to them, so their processes inherit only what a framework needs
(:data:`ALLOWED_NAMES`, :data:`ALLOWED_PREFIXES`), and no value that carries a credential
(:func:`carries_secret`); a dropped variable is named in a warning, never its value.
"""
import logging
import re
from typing import Dict, Mapping, Optional, Set

from ..._core import settings
from ..._core.redaction import holds_secret

logger = logging.getLogger("flytekitplugins_ddlscale.local")
_warned: Set[str] = set()

ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ",
    "TMPDIR", "TEMP", "TMP",
    "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
    "LD_LIBRARY_PATH", settings.JAVA_HOME.name,
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    settings.WATCH_GRACE.name,
})
"""Variables passed on by name: finding programs, files, the locale and the Python and Java in use, and the
scheduler watch's grace (read in the scheduler, :mod:`.dask_watch`)."""

ALLOWED_PREFIXES = ("LC_", "DASK_", "RAY_", "SPARK_", "PYSPARK_")
"""The frameworks' own settings (``DASK_DISTRIBUTED__...``, ``RAY_...``, ``SPARK_...``) and the locale."""

_CREDENTIAL = re.compile(
    r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS$|CREDENTIAL|AUTH|COOKIE|SESSION|"
    r"^AWS_|^DOMINO_|^AZURE_|^GOOGLE_|^GCP_|^KUBECONFIG$|^KUBE_",
    re.IGNORECASE,
)
"""Names that look like a credential are dropped even under an allowed prefix (``RAY_AUTH_TOKEN``,
``SPARK_AUTH_SECRET``): a driver that needs one of its own sets it explicitly."""


def is_credential_name(name: str) -> bool:
    """Whether ``name`` looks like a variable holding a credential (a key, token, secret, password,
    or a cloud or Domino setting)."""
    return bool(_CREDENTIAL.search(name))


_SECRET_IN_VALUE = re.compile(
    r"(?i)(secret|passw(or)?d|passwd|token|api[-_.]?key|access[-_.]?key|private[-_.]?key|credential|"
    r"auth[-_.]?(key|secret|token)|session[-_.]?key)[\w.-]*\s*="
)
"""A setting of something secret inside a value: ``-Dspark.authenticate.secret=...``, ``password=...``,
``--token=...``."""


def carries_secret(value: str) -> bool:
    """Whether ``value`` holds a credential: a secret-named setting (``-D...secret=``, ``token=``), a URL with
    ``user:password@``, or a secret the plugin registered (:mod:`..._core.redaction`)."""
    return bool(_SECRET_IN_VALUE.search(value)) or holds_secret(value)


def is_allowed(name: str) -> bool:
    """Whether a cluster process inherits ``name`` from the process that starts the cluster."""
    if is_credential_name(name):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def cluster_environment(source: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables of ``source`` (default: this process's environment) a cluster process starts with.

    Raises :class:`InvalidInputError` naming ``$DDLSCALE_WATCH_GRACE`` and the values it takes for a bad one.
    """
    env = settings.environment(source)
    passed = {name: value for name, value in env.items() if is_allowed(name)}
    dropped = sorted(name for name, value in passed.items() if carries_secret(value))
    news = [name for name in dropped if name not in _warned]
    if news:  # once per variable and process, not once per cluster process started
        _warned.update(news)
        logger.warning("not passed to the cluster's processes, as their values carry a credential: %s",
                       ", ".join(news))
    kept = {name: value for name, value in passed.items() if name not in dropped}
    if settings.WATCH_GRACE.is_set(env):
        kept[settings.WATCH_GRACE.name] = f"{settings.WATCH_GRACE.value(env=env):g}"
    return kept
