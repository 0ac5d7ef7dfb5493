"""Every environment variable the package reads or sets for others, in one place (``docs/settings.md`` is this
list: :func:`markdown_table`); no other module reads ``os.environ`` for a variable or spells its name.
:meth:`Setting.value` reads an argument, else the variable (at each call), else the default."""
import os
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from ..errors import InvalidInputError
from .validation import BACKEND_NAMES, BUILTIN_BACKENDS, validate_url

Environ = Optional[Mapping[str, str]]
Parser = Callable[[Any, str, str], Any]
"""``(value, field, allowed)`` -> the typed value, or None for "unset"; raises InvalidInputError naming ``field``."""

PREFIX = "DDLSCALE_"
"""The prefix of the plugin's own variables."""

OURS, DOMINO, FRAMEWORK = "ddlscale", "domino", "framework"
GROUPS = (OURS, DOMINO, FRAMEWORK)


def environment(env: Environ = None) -> Mapping[str, str]:
    """``env``, else this process's environment as it is now."""
    return os.environ if env is None else env


def ddlscale_variables(env: Environ = None) -> Dict[str, str]:
    """Every ``DDLSCALE_*`` variable of ``env`` (default: this process's), as set."""
    return {name: value for name, value in environment(env).items() if name.startswith(PREFIX)}


# Parsers: each takes the raw value (text from the environment, or an argument) and the field to
# name in an error; None means "unset" (the default applies).

def _text(value: Any, field: str, allowed: str) -> Optional[str]:
    if not isinstance(value, str):
        raise InvalidInputError(field, value, allowed)
    return value


def _stripped(value: Any, field: str, allowed: str) -> Optional[str]:
    return _text(value, field, allowed).strip() or None


def _lowered(value: Any, field: str, allowed: str) -> str:
    # A name set to blanks stays a (refused) empty name rather than falling back to a default.
    return _text(value, field, allowed).strip().lower()


def _no_slash(value: Any, field: str, allowed: str) -> Optional[str]:
    return _text(value, field, allowed).rstrip("/") or None


_OFF = ("off", "0", "false", "no")
_ON = ("", "on", "1", "true", "yes")


def _on_off(value: Any, field: str, allowed: str) -> bool:
    text = value.strip().lower() if isinstance(value, str) else value
    if text in _OFF:
        return False
    if text in _ON:
        return True
    raise InvalidInputError(field, value, allowed)


def _truthy(value: Any, field: str, allowed: str) -> bool:
    # Anything else reads as "not set": a summary line is never worth failing a run over.
    return isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on")


def _port(value: Any, field: str, allowed: str) -> Optional[int]:
    text = _text(value, field, allowed).strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise InvalidInputError(field, text, allowed)
    return int(text)


def _positive_number(value: Any, field: str, allowed: str) -> Optional[float]:
    if isinstance(value, str) and not value.strip():  # blank is unset, as for a port
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    # float() also reads other scripts' digits ("٣" is 3): a setting is written in ASCII.
    foreign = isinstance(value, str) and not value.isascii()
    if isinstance(value, bool) or foreign or not number > 0 or number == float("inf"):
        raise InvalidInputError(field, value, allowed)
    return number


MAX_CALL_BUDGET = 9.0
"""Longest call budget: FlytePropeller gives a connector call 10 s, and the answer must travel back."""


def _call_budget(value: Any, field: str, allowed: str) -> Optional[float]:
    number = _positive_number(value, field, allowed)
    if number is not None and number > MAX_CALL_BUDGET:
        raise InvalidInputError(field, value, allowed)
    return number


def _url(value: Any, field: str, allowed: str) -> Optional[str]:
    if isinstance(value, str) and not value.strip():
        return None
    return validate_url(value, field)


LINK_FIELDS = ("kind", "name", "namespace", "service", "host", "port")
"""What a dashboard link template may name: the cluster's kind, name and namespace, and its head's service
(the host name's first label), host and port as the connector finds them."""


def _link_template(value: Any, field: str, allowed: str) -> Optional[str]:
    text = _stripped(value, field, allowed)
    if text is None:
        return None
    try:
        named = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError:
        raise InvalidInputError(field, value, allowed, reason="unbalanced braces") from None
    unknown = sorted(named - set(LINK_FIELDS))
    if unknown:
        raise InvalidInputError(field, value, allowed, reason=f"it names {', '.join('{%s}' % name for name in unknown)}")
    try:
        sample = text.format(kind="dask", name="x", namespace="ns", service="x-head", host="x-head.ns.svc", port=8787)
    except (ValueError, IndexError, KeyError, AttributeError):
        raise InvalidInputError(field, value, allowed) from None
    parts = urlsplit(sample)
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        raise InvalidInputError(field, value, allowed)
    return text


def _items(value: Any, field: str, allowed: str) -> Optional[Tuple[str, ...]]:
    entries = tuple(part.strip().lower() for part in _text(value, field, allowed).split(",") if part.strip())
    return entries or None


@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, type, default, the values it takes and what it means."""

    name: str
    kind: str
    """What it holds, for the table: text, path, URL, port, number, on/off, list, secret."""
    parse: Parser
    allowed: str
    meaning: str
    group: str = OURS
    default: Any = None
    """The value when unset; a callable is called at each read (a default under ``$HOME``)."""
    shown_default: str = ""
    """The default as the table shows it; empty: ``default`` itself, or "unset"."""

    def raw(self, env: Environ = None) -> Optional[str]:
        """The variable's text in ``env`` (default: this process's environment, read now); None when
        unset or empty."""
        return environment(env).get(self.name) or None

    def is_set(self, env: Environ = None) -> bool:
        """Whether the variable is set to something other than an empty string."""
        return self.raw(env) is not None

    def value(self, argument: Any = None, env: Environ = None, field: Optional[str] = None) -> Any:
        """``argument`` if not None (checked, an error names ``field``), else the variable (checked,
        an error names the variable), else the default."""
        if argument is not None:
            parsed = self.parse(argument, field or self.name, self.allowed)
        else:
            raw = self.raw(env)
            parsed = None if raw is None else self.parse(raw, self.name, self.allowed)
        if parsed is not None:
            return parsed
        return self.default() if callable(self.default) else self.default

    @property
    def default_text(self) -> str:
        """The default as ``docs/settings.md`` shows it."""
        if self.shown_default:
            return self.shown_default
        return "unset" if self.default is None or callable(self.default) else str(self.default)


_ALL: List[Setting] = []


def _define(name: str, kind: str, parse: Parser, allowed: str, meaning: str, **options: Any) -> Setting:
    setting = Setting(name, kind, parse, allowed, meaning, **options)
    _ALL.append(setting)
    return setting


def _domino(name: str, kind: str, parse: Parser, allowed: str, meaning: str, **options: Any) -> Setting:
    return _define(name, kind, parse, allowed, meaning, group=DOMINO, **options)


def _framework(name: str, kind: str, parse: Parser, allowed: str, meaning: str, **options: Any) -> Setting:
    return _define(name, kind, parse, allowed, meaning, group=FRAMEWORK, **options)


_ANY_TEXT = "any text"
_PORT = "a TCP port number from 1 to 65535"
_HEAD_URL = "an http:// or https:// URL of the cluster head's dashboard or web UI (e.g. http://host:8787), or None"
_LIST = "comma-separated names"
_PATTERNS = "comma-separated shell-style patterns"
_FILE = "a file path"
_SET_BY_US = "set by the plugin"

# The plugin's own.
BACKEND = _define(
    "DDLSCALE_BACKEND", "text", _lowered, BACKEND_NAMES,
    "the backend when none is named", shown_default="scaler inside a Domino run, else local",
)
STATE_DIR = _define(
    "DDLSCALE_STATE_DIR", "path", _text, "a folder path",
    "where the scaler and local backends keep baselines, claims and local clusters",
    default=lambda: str(Path.home() / ".ddlscale"), shown_default="~/.ddlscale",
)
SCALER_MAX_RPS = _define(
    "DDLSCALE_SCALER_MAX_RPS", "number", _positive_number, "a number of requests per second > 0",
    "polls per second this process sends to one scaler service", default=100.0,
)
TIERS_FILE = _define(
    "DDLSCALE_TIERS_FILE", "path", _text, _FILE,
    "hardware tiers (YAML) for the Kubernetes backend when Domino's API is not configured",
)
LOCAL_TIERS = _define(
    "DDLSCALE_LOCAL_TIERS", "path", _text, _FILE,
    "hardware tiers (YAML) of local clusters", shown_default="the plugin's data/local_tiers.yaml",
)
RAY_EXECUTABLE = _define(
    "DDLSCALE_RAY_EXECUTABLE", "path", _stripped, "an executable file",
    "the `ray` command that starts local Ray nodes", shown_default="`ray` beside this Python, else on PATH",
)
FRAMEWORK_READINESS = _define(
    "DDLSCALE_FRAMEWORK_READINESS", "on/off", _on_off, "on/off (also 1/0, true/false, yes/no)",
    "whether waits also check workers registered with the framework", default=True, shown_default="on",
)
FRAMEWORK_URL = _define(
    "DDLSCALE_FRAMEWORK_URL", "URL", _url, _HEAD_URL, "the cluster head's dashboard or web UI, any kind",
)
DASK_URL = _define("DDLSCALE_DASK_URL", "URL", _url, _HEAD_URL, "the Dask scheduler's dashboard (before the general URL)")
RAY_URL = _define("DDLSCALE_RAY_URL", "URL", _url, _HEAD_URL, "the Ray head's dashboard (before the general URL)")
SPARK_URL = _define("DDLSCALE_SPARK_URL", "URL", _url, _HEAD_URL, "the Spark master's web UI (before the general URL)")
DASK_DASHBOARD_PORT = _define(
    "DDLSCALE_DASK_DASHBOARD_PORT", "port", _port, _PORT,
    "the Dask dashboard's port on $DASK_SCHEDULER_SERVICE_HOST", default=8787,
)
RAY_DASHBOARD_PORT = _define(
    "DDLSCALE_RAY_DASHBOARD_PORT", "port", _port, _PORT,
    "the Ray dashboard's port on $RAY_HEAD_SERVICE_HOST (the local backend sets it for a block)", default=8265,
)
SPARK_WEBUI_PORT = _define(
    "DDLSCALE_SPARK_WEBUI_PORT", "port", _port, _PORT,
    "the Spark master web UI's port on spark.master's host (the local backend sets it for a block)",
    shown_default="$SPARK_MASTER_WEBUI_PORT, else 8080",
)
CONNECTOR_BACKENDS = _define(
    "DDLSCALE_CONNECTOR_BACKENDS", "list", _items, f"{_LIST}: {', '.join(BUILTIN_BACKENDS)} or an entry-point backend",
    "backends a connector serves (local only when listed)", default=("scaler", "kubernetes"),
    shown_default="scaler,kubernetes",
)
CONNECTOR_NAMESPACES = _define(
    "DDLSCALE_CONNECTOR_NAMESPACES", "list", _items, _LIST, "namespaces a connector serves", shown_default="any",
)
CONNECTOR_CLUSTERS = _define(
    "DDLSCALE_CONNECTOR_CLUSTERS", "list", _items, f"{_PATTERNS} of <kind>/<name>",
    "clusters a connector serves", shown_default="any",
)
CONNECTOR_FRAMEWORK_HOSTS = _define(
    "DDLSCALE_CONNECTOR_FRAMEWORK_HOSTS", "list", _items, f"{_PATTERNS} of host names",
    "hosts a template's framework_url may name, besides the head the backend reports", default=(),
    shown_default="none",
)
CONNECTOR_POLICY = _define(
    "DDLSCALE_CONNECTOR_POLICY", "path", _text, f"{_FILE} (YAML: docs/connector.md, Per-project policy)",
    "a connector's per-project rules (which backends, namespaces, kinds, clusters, sizes and tiers each Flyte "
    "project and domain may use); unset, every project may use all the connector serves",
)
CONNECTOR_CALL_BUDGET = _define(
    "DDLSCALE_CONNECTOR_CALL_BUDGET", "number", _call_budget, "a number of seconds > 0 and at most 9",
    "seconds a connector's GetTask waits for the backend before answering RUNNING with the last state known "
    "(FlytePropeller gives each call 10 s)",
    default=7.0, shown_default="7",
)
CONNECTOR_DASHBOARD_URL = _define(
    "DDLSCALE_CONNECTOR_DASHBOARD_URL", "URL", _link_template,
    "an http:// or https:// URL a browser reaches, with {kind}, {name} and {namespace} of the cluster and "
    "{service}, {host} and {port} of its head filled in (e.g. https://dashboards.example.com/{namespace}/{name})",
    "where the Flyte UI's link to a cluster's dashboard points (the framework's page added: /status for Dask); "
    "unset, no link: a head's own address (a *.svc name) is not one a browser reaches",
    shown_default="unset: no link",
)
QUIET = _define(
    "DDLSCALE_QUIET", "on/off", _truthy, "1, true, yes or on silence; anything else does not",
    "no summary or progress lines", default=False, shown_default="off",
)
LOCAL_CLUSTER = _define(
    "DDLSCALE_LOCAL_CLUSTER", "path", _text, "a cluster folder",
    f"{_SET_BY_US} in every local cluster process: its cluster's folder (finds unrecorded processes)",
)
WATCH_GRACE = _define(
    "DDLSCALE_WATCH_GRACE", "number", _positive_number, "a number of seconds > 0",
    "seconds a local Dask scheduler no record holds runs on before it closes (read by the scheduler)",
    default=30.0, shown_default="30",
)
NO_WAIT_LIMIT = _define(
    "DDLSCALE_NO_WAIT_LIMIT", "number", _positive_number, "a number of seconds > 0",
    "seconds an operation that does not wait for its workers (`wait=False`, `--no-wait`, the connector's "
    "requests) rides out a backend outage before it times out",
    default=30.0, shown_default="30",
)

# Domino's.
CLUSTER_SCALER_BASE_URL = _domino(
    "CLUSTER_SCALER_BASE_URL", "URL", _no_slash, "an http:// or https:// URL",
    "Domino's cluster scaler service; when set, the default backend is scaler",
    default="http://ddl-cluster-scaler-svc.domino-field.svc.cluster.local",
)
DOMINO_RUN_ID = _domino(
    "DOMINO_RUN_ID", "text", _text, _ANY_TEXT,
    "the Domino run: a bare kind names its cluster <kind>-<run id>; when set, the default backend is scaler",
)
DOMINO_API_HOST = _domino(
    "DOMINO_API_HOST", "URL", _text, "an http:// or https:// URL",
    "Domino's API (hardware tiers) for the scaler backend, before $DOMINO_API_PROXY",
)
DOMINO_API_PROXY = _domino(
    "DOMINO_API_PROXY", "URL", _text, "an http:// or https:// URL",
    "Domino's API proxy: short-lived tokens (first choice of credentials) and hardware tiers",
)
DOMINO_TOKEN = _domino("DOMINO_TOKEN", "secret", _text, _ANY_TEXT, "a Domino token, when there is no API proxy")
DOMINO_TOKEN_FILE = _domino(
    "DOMINO_TOKEN_FILE", "path", _text, _FILE,
    "a file holding a Domino token (a mounted Secret), read again when it changes; after $DOMINO_TOKEN",
)
DOMINO_API_KEY = _domino(
    "DOMINO_API_KEY", "secret", _text, _ANY_TEXT, "a Domino API key, when there is no proxy or token",
)
DOMINO_STARTING_USER_ID = _domino(
    "DOMINO_STARTING_USER_ID", "text", _text, _ANY_TEXT,
    "the Kubernetes backend's owner: clusters of other owners are refused unless allow_foreign",
)

# The frameworks' (where a run finds its head; what the plugin sets for a block or a cluster process).
def _head_service(service: str, head: str, port: str) -> Tuple[Setting, Setting]:
    """The pair of variables Domino sets for a framework head's service, ``<service>_HOST`` and
    ``<service>_PORT`` (as Kubernetes names a Service's), and the plugin sets for a block."""
    where = f"(Domino sets it; {_SET_BY_US} for a block)"
    return (
        _framework(f"{service}_HOST", "text", _stripped, "a host name or address", f"{head} {where}"),
        _framework(f"{service}_PORT", "port", _port, _PORT, f"{port} {where}"),
    )


def _tls_files(
    names: Tuple[str, str, str], framework: str, trusting: str, presenting: str
) -> Tuple[Setting, Setting, Setting]:
    """The variables ``names`` of the three files of a framework's TLS the plugin sets for a local cluster: the
    authority ``trusting`` trusts, the certificate ``presenting`` presents, and its private key."""
    ours = f"{_SET_BY_US}: a local {framework} cluster's"
    ca, cert, key = names
    return (
        _framework(ca, "path", _text, _FILE, f"the authority {trusting} trusts ({ours} own)"),
        _framework(cert, "path", _text, _FILE, f"the certificate {presenting} presents ({ours})"),
        _framework(key, "path", _text, _FILE, f"the file of that certificate's private key ({_SET_BY_US}: in a local "
                   f"{framework} cluster's private folder)"),
    )


DASK_SCHEDULER_SERVICE_HOST, DASK_SCHEDULER_SERVICE_PORT = _head_service(
    "DASK_SCHEDULER_SERVICE", "the Dask scheduler", "the Dask scheduler's port"
)
DASK_SCHEDULER_ADDRESS = _framework(
    "DASK_SCHEDULER_ADDRESS", "text", _text, "tls://host:port",
    f"the scheduler a bare Client() connects to ({_SET_BY_US} for a block on a local Dask cluster)",
)
DASK_DEFAULT_SCHEME = _framework(
    "DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME", "text", _text, "tls or tcp",
    f"the scheme of a Dask address written host:port ({_SET_BY_US} to tls for a block on a local Dask cluster)",
)
DASK_REQUIRE_ENCRYPTION = _framework(
    "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION", "text", _text, "True or False",
    f"whether Dask refuses unencrypted connections ({_SET_BY_US} to True for a block on a local Dask cluster)",
)
DASK_TLS_CA_FILE, DASK_TLS_CLIENT_CERT, DASK_TLS_CLIENT_KEY = _tls_files(
    ("DASK_DISTRIBUTED__COMM__TLS__CA_FILE", "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT",
     "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"), "Dask", "a Dask client", "a Dask client",
)
DASK_SCHEDULER_HTTP_ROUTES = _framework(
    "DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES", "text", _text, "a Python list of module names",
    f"what a Dask scheduler's HTTP server serves ({_SET_BY_US} for local schedulers: health, counts, metrics)",
)
DASK_TEMPORARY_DIRECTORY = _framework(
    "DASK_TEMPORARY_DIRECTORY", "text", _text, "a folder",
    f"where a Dask process keeps its scratch space ({_SET_BY_US} for local schedulers: the cluster's private "
    "folder, not a shared one under /tmp)",
)
RAY_HEAD_SERVICE_HOST, RAY_HEAD_SERVICE_PORT = _head_service("RAY_HEAD_SERVICE", "the Ray head", "the Ray client port")
RAY_ADDRESS = _framework(
    "RAY_ADDRESS", "text", _text, "ray://host:port",
    f"Ray Client's address ({_SET_BY_US} for a block on a KubeRay cluster)",
)
RAY_AUTH_MODE = _framework(
    "RAY_AUTH_MODE", "text", _stripped, "token, or anything else for none",
    "Ray's token authentication: the framework check sends the token when it is token",
)
RAY_AUTH_TOKEN = _framework(
    "RAY_AUTH_TOKEN", "secret", _stripped, _ANY_TEXT, "Ray's token, before $RAY_AUTH_TOKEN_PATH",
)
RAY_AUTH_TOKEN_PATH = _framework(
    "RAY_AUTH_TOKEN_PATH", "path", _stripped, _FILE,
    f"the file holding Ray's token ({_SET_BY_US} for local Ray clusters)", shown_default="~/.ray/auth_token",
)
RAY_USE_TLS = _framework(
    "RAY_USE_TLS", "text", _text, "1 or 0",
    f"Ray's mutual TLS on its gRPC channels ({_SET_BY_US} to 1 for local Ray nodes and a block on a local Ray cluster)",
)
RAY_TLS_CA_CERT, RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY = _tls_files(
    ("RAY_TLS_CA_CERT", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY"), "Ray", "Ray's TLS", "a Ray process or client",
)
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER = _framework(
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "text", _text, "0",
    f"{_SET_BY_US} to 0 in local Ray node processes: Ray's address look-ups answer loopback",
)
SPARK_MASTER = _framework(
    "SPARK_MASTER", "text", _text, "a Spark master URL (spark://host:7077)",
    "the Spark master, before spark.master in spark-defaults.conf",
)
SPARK_CONF_DIR = _framework(
    "SPARK_CONF_DIR", "path", _text, "a folder path",
    f"where spark-defaults.conf is, instead of $SPARK_HOME/conf ({_SET_BY_US} for a block)",
)
SPARK_HOME = _framework(
    "SPARK_HOME", "path", _text, "a folder path", f"Spark's installation ({_SET_BY_US} in local Spark processes)",
)
SPARK_MASTER_WEBUI_PORT = _framework(
    "SPARK_MASTER_WEBUI_PORT", "port", _port, _PORT, "the Spark master web UI's port, after $DDLSCALE_SPARK_WEBUI_PORT",
    default=8080,
)
SPARK_LOCAL_IP = _framework(
    "SPARK_LOCAL_IP", "text", _text, "a host address",
    f"{_SET_BY_US} to the loopback host for local Spark processes and blocks",
)
SPARK_LOCAL_DIRS = _framework(
    "SPARK_LOCAL_DIRS", "path", _text, "folder paths",
    f"Spark's scratch space, /tmp by default ({_SET_BY_US} to the cluster's private folder for local Spark processes)",
)
SPARK_LAUNCHER_OPTS = _framework(
    "SPARK_LAUNCHER_OPTS", "text", _text, "JVM options",
    "JVM options of Spark's launcher; local Spark processes get the plugin's options ahead of them", default="",
    shown_default="empty",
)
SPARK_DAEMON_JAVA_OPTS = _framework(
    "SPARK_DAEMON_JAVA_OPTS", "text", _text, "JVM options",
    "JVM options of Spark's daemons; local Spark processes get the plugin's options ahead of them", default="",
    shown_default="empty",
)
PYSPARK_PYTHON = _framework(
    "PYSPARK_PYTHON", "path", _text, "a Python executable",
    f"the Python of Spark executors ({_SET_BY_US} for a block on a local Spark cluster)",
)
JAVA_HOME = _framework(
    "JAVA_HOME", "path", _stripped, "a folder path", "the Java local Spark clusters run on, else java on PATH",
)
KUBECONFIG = _framework(
    "KUBECONFIG", "path", _text, _FILE, "the Kubernetes backend's kubeconfig when none is given",
    shown_default="~/.kube/config",
)
KUBERNETES_SERVICE_HOST = _framework(
    "KUBERNETES_SERVICE_HOST", "text", _text, _ANY_TEXT,
    "set in a pod: the Kubernetes backend uses the in-cluster service account unless given a kubeconfig",
)

SETTINGS: Tuple[Setting, ...] = tuple(_ALL)
"""Every setting, in the order of the table."""

_KIND_URLS: Dict[str, Setting] = {"dask": DASK_URL, "ray": RAY_URL, "spark": SPARK_URL}


def kind_url(kind: str) -> Optional[Setting]:
    """The head URL setting of framework ``kind`` (``DDLSCALE_DASK_URL`` for ``dask``), None for others."""
    return _KIND_URLS.get(kind)


def _cell(text: str) -> str:
    # "<point>" would read as an HTML tag.
    return text.replace("<", "\\<")


def markdown_table() -> str:
    """The table of ``docs/settings.md``: one row per setting."""
    rows = ["| variable | group | type | default | allowed | meaning |", "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        cells = (s.group, s.kind, s.default_text, s.allowed, s.meaning)
        rows.append(f"| `{s.name}` | " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(rows) + "\n"
