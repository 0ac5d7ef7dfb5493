"""What a local cluster's ``cluster.json`` may hold, checked with the rules of user input before use: the
record says how many workers to start, which pids to signal, which ports to bind and which folders to
write and remove, so a value user input could not give is refused (:class:`InvalidInputError`; the caller
names the file in a :class:`CorruptRecordError`) before any process is started or stopped.
"""
import ipaddress
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict

from ...errors import InvalidInputError
from ..._core.records import mapping, only_fields
from ..._core.records import HOLDER_PATTERN
from ..._core.validation import MAX_REPLICAS, validate_int, validate_replicas, validate_text, validate_tier_name, validate_timestamp
from ._ray_ops import RAY_TEMP_PREFIX, TOKEN_FILE

_RAY_TEMP_NAME = re.compile(re.escape(RAY_TEMP_PREFIX) + r"[A-Za-z0-9_]{8}")
_LOOPBACK = "a loopback address (127.0.0.0/8 or ::1) or localhost"
_KEY = re.compile(r"[a-z][a-z0-9_]{0,62}")
_WORKER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,126}[a-z0-9])?")
_MAX_PID = 2**22
_PORT_MAX = 65535
_FIELDS = (
    "kind", "name", "namespace", "host", "port", "ports", "scheduler", "head_hw_tier", "worker_hw_tier",
    "desired", "workers", "next_index", "ephemeral", "framework", "created_at", "pending",
)
_PENDING_FIELDS = ("desired", "holder", "since")
_WORKER_FIELDS = ("name", "pid", "start", "tier", "nthreads", "memory_limit")


def check_cluster_json(data: Dict[str, Any], folder: Path) -> None:
    """Raise :class:`InvalidInputError` naming the first field of ``data`` (a ``cluster.json`` in
    ``folder``) whose value user input could not give; the cluster's ref is checked by the caller."""
    only_fields(data, _FIELDS, ("kind", "name", "host", "port"), "")
    check_loopback(data["host"], "host")
    validate_int(data["port"], "port", 0, _PORT_MAX)
    for key, port in mapping(data.get("ports") or {}, "ports").items():
        validate_text(key, "ports", "port names (lowercase letters, digits, '_')", _KEY)
        validate_int(port, f"ports.{key}", 1, _PORT_MAX)
    if data.get("scheduler") is not None:
        check_process(data["scheduler"], "scheduler")
    validate_tier_name(data.get("head_hw_tier"), field="head_hw_tier")
    if data.get("worker_hw_tier"):
        validate_tier_name(data["worker_hw_tier"], field="worker_hw_tier")
    validate_replicas(data.get("desired", 0), field="desired")
    workers = data.get("workers") or []
    if not isinstance(workers, list) or len(workers) > MAX_REPLICAS:
        raise InvalidInputError("workers", workers, f"a list of at most {MAX_REPLICAS} worker records")
    for index, worker in enumerate(workers):
        _check_worker(worker, f"workers[{index}]")
    validate_int(data.get("next_index", 0), "next_index", 0)
    if not isinstance(data.get("ephemeral", True), bool):
        raise InvalidInputError("ephemeral", data["ephemeral"], "true or false")
    _check_framework(mapping(data.get("framework") or {}, "framework"), folder)
    if data.get("created_at"):
        validate_timestamp(data["created_at"], "created_at")
    if data.get("pending") is not None:
        pending = mapping(data["pending"], "pending")
        only_fields(pending, _PENDING_FIELDS, _PENDING_FIELDS, "pending")
        validate_replicas(pending["desired"], field="pending.desired")
        validate_text(pending["holder"], "pending.holder", "host:pid of the process making the change", HOLDER_PATTERN)
        validate_timestamp(pending["since"], "pending.since")


def check_loopback(value: Any, field: str) -> str:
    """Return ``value`` if it is a loopback address or ``localhost``, told apart without a name lookup: the
    processes listen there (never on another interface) and a repair never waits on DNS."""
    text = validate_text(value, field, _LOOPBACK)
    if text != "localhost":
        try:
            loopback = ipaddress.ip_address(text).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise InvalidInputError(field, value, _LOOPBACK)
    return text


def check_process(data: Any, where: str) -> None:
    """Refuse ``data`` unless it is a process as records hold one: ``{"pid", "start"}``, both integers."""
    only_fields(mapping(data, where), ("pid", "start"), ("pid", "start"), where)
    validate_int(data["pid"], f"{where}.pid", 1, _MAX_PID)
    validate_int(data["start"], f"{where}.start", 0)


def _check_worker(data: Any, where: str) -> None:
    only_fields(mapping(data, where), _WORKER_FIELDS, _WORKER_FIELDS, where)
    validate_text(data["name"], f"{where}.name", "a worker name (lowercase a-z, 0-9, '-')", _WORKER_NAME)
    check_process({"pid": data["pid"], "start": data["start"]}, where)
    validate_tier_name(data["tier"], field=f"{where}.tier")
    validate_int(data["nthreads"], f"{where}.nthreads", 1)
    validate_int(data["memory_limit"], f"{where}.memory_limit", 0)


def _check_framework(facts: Dict[str, Any], folder: Path) -> None:
    """The facts a driver records: paths must be the cluster's own files (Spark's, Ray's token, Dask's TLS
    folder) or its Ray temp folder."""
    own_files = (
        ("conf_dir", folder / "conf"), ("daemon_conf", folder / "spark-daemon.conf"), ("auth_token_path", folder / TOKEN_FILE),
        ("tls_dir", folder / "tls"),
    )
    for key, expected in own_files:
        # The same state directory may be reached through a linked path: the file is the cluster's own
        # when both spellings resolve to it.
        if key in facts and (not isinstance(facts[key], str)
                             or os.path.realpath(facts[key]) != os.path.realpath(expected)):
            raise InvalidInputError(f"framework.{key}", facts[key], str(expected))
    if "python" in facts:
        validate_text(facts["python"], "framework.python", "an absolute path to a Python executable")
        if not os.path.isabs(facts["python"]):
            raise InvalidInputError("framework.python", facts["python"], "an absolute path to a Python executable")
    if "executor_memory_mib" in facts:
        validate_int(facts["executor_memory_mib"], "framework.executor_memory_mib", 1)
    for name, ports in mapping(facts.get("workers") or {}, "framework.workers").items():
        validate_text(name, "framework.workers", "worker names (lowercase a-z, 0-9, '-')", _WORKER_NAME)
        for key, port in mapping(ports, f"framework.workers.{name}").items():
            validate_int(port, f"framework.workers.{name}.{key}", 1, _PORT_MAX)
    if "temp_dir" in facts:
        check_ray_temp_dir(facts["temp_dir"], folder, "framework.temp_dir")


def check_ray_temp_dir(value: Any, folder: Path, field: str) -> str:
    """Return ``value`` if it can be the Ray temp folder of the cluster in ``folder``: ``folder/ray``,
    or a folder ``ddlscale-ray-XXXXXXXX`` directly in the temp folder (what ``mkdtemp`` made)."""
    allowed = f"{folder / 'ray'}, or {Path(tempfile.gettempdir()) / RAY_TEMP_PREFIX}XXXXXXXX made by ddlscale"
    text = validate_text(value, field, allowed)
    path = Path(text)
    inside = path == folder / "ray"
    made = path.parent == Path(tempfile.gettempdir()) and bool(_RAY_TEMP_NAME.fullmatch(path.name))
    if not (inside or made):
        raise InvalidInputError(field, value, allowed)
    return text
