"""Talking to a local Dask scheduler, and the command lines that start Dask processes.

Which workers a scheduler registered is read from the file its preload keeps (:func:`listed_workers`), so
starting and waiting never import ``distributed``; retiring workers asks the scheduler, importing it inside
that call, over one connection in a private event loop closed with the call. Every process and call speaks
``tls://`` with the cluster's certificate (:mod:`._secrets`).
"""
import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Set

from ..._core import settings
from ..._core.records import json_object, only_fields, reading
from ..._core.validation import MAX_REPLICAS, validate_int
from ...errors import BackendUnavailableError, InvalidInputError, UnsafePathError
from ..._core.waiting import probe_timeout
from ..._core.progress import seconds
from .._support.privatefs import read_record_text
from ._secrets import DaskTls
from ._dask_watch import WORKERS_FILE
from ._procs import ProcessId, python_module, with_environment
from ._record_check import check_process
from ._tiers import WorkerShape

SCHEDULER_HTTP_ROUTES = ("distributed.http.health", "distributed.http.scheduler.json", "distributed.http.scheduler.prometheus")
"""What the scheduler's HTTP server (unauthenticated: Dask's TLS covers its comms only) serves: health,
counts and metrics. Not Dask's default ``info`` pages (worker logs, call stacks, task keys, readable by
any local user) nor its ``proxy`` to the workers' pages."""
WATCH_PRELOAD = Path(__file__).with_name("_dask_watch.py")
"""The scheduler preload that closes a scheduler no record holds (:mod:`.dask_watch`)."""
SCHEDULER_MODULE = "distributed.cli.dask_scheduler"
WORKER_MODULE = "distributed.cli.dask_worker"


def scheduler_argv(host: str, port: int, scheduler_file: str, tls: DaskTls, scratch: str) -> List[str]:
    """``dask scheduler`` on ``tls://host:port`` (writing ``scheduler_file`` for ``Client(scheduler_file=...)``),
    taking only peers with a certificate of ``tls``'s authority. Its HTTP server (served without a dashboard,
    on every interface by default) is held to ``host`` on a port the OS picks, serving
    :data:`SCHEDULER_HTTP_ROUTES` only; it preloads :mod:`._dask_watch`; its scratch space is the private
    ``scratch`` (Dask's default is shared by every user, who could make it first)."""
    routes = {
        settings.DASK_SCHEDULER_HTTP_ROUTES.name: repr(list(SCHEDULER_HTTP_ROUTES)),
        settings.DASK_TEMPORARY_DIRECTORY.name: scratch,
    }
    return with_environment(routes, [
        *python_module(SCHEDULER_MODULE),
        "--host", host,
        "--port", str(port),
        "--protocol", "tls",
        *tls.argv(),
        "--no-dashboard",
        "--dashboard-address", f"{host}:0",
        "--scheduler-file", scheduler_file,
        "--preload", str(WATCH_PRELOAD),
    ])


def worker_argv(address: str, name: str, shape: WorkerShape, local_directory: str, host: str, tls: DaskTls) -> List[str]:
    """One ``dask worker`` named ``name`` of ``shape`` (no nanny: one pid per worker), speaking only ``tls://``
    with ``tls``'s certificate, its HTTP server held to ``host``; ``--death-timeout`` makes a worker whose
    scheduler is gone exit on its own."""
    return [
        *python_module(WORKER_MODULE),
        address,
        "--protocol", "tls",
        *tls.argv(),
        "--name", name,
        "--nthreads", str(shape.nthreads),
        "--memory-limit", str(shape.memory_limit),
        "--no-nanny",
        "--no-dashboard",
        "--dashboard-address", f"{host}:0",
        "--host", host,
        "--local-directory", local_directory,
        "--death-timeout", "60",
    ]


WORKER_NAME_MAX = 256
"""Characters of a worker name the workers file may hold (ddlscale names its workers in 63; a worker
joined by hand is named after its address by default)."""


@dataclass(frozen=True)
class ListedWorkers:
    """What a scheduler's :data:`~.dask_watch.WORKERS_FILE` holds."""

    names: Set[str]
    """The names of the workers registered with it."""
    http_port: int
    """Where its HTTP server listens (``/health``: whether it still answers)."""


def listed_workers(cluster_dir: Path, scheduler: ProcessId) -> Optional[ListedWorkers]:
    """What ``scheduler`` (the cluster's recorded one) lists in ``cluster_dir``'s
    :data:`~.dask_watch.WORKERS_FILE`; None until it wrote that file (starting: it writes it once
    listening), and for a file naming another scheduler (an earlier one of the folder: never trusted, its
    workers are not this scheduler's).

    Raises :class:`CorruptRecordError` naming the file and what it must be for a link, a file that is
    not regular, not this user's, too large or unreadable, or not a worker list as the preload writes it.
    """
    path = cluster_dir / WORKERS_FILE
    remedy = (
        "the cluster's Dask scheduler rewrites it whenever a worker joins or leaves; `ddlscale local down` "
        "and `up` (or a head restart) start a scheduler that writes it anew"
    )
    fields = ("scheduler", "http_port", "workers")
    with reading(str(path), remedy):
        try:
            text = read_record_text(path, own=True)
        except FileNotFoundError:
            return None
        except UnsafePathError as exc:  # a link, never followed
            raise InvalidInputError(WORKERS_FILE, exc.reason, "a regular file, not a link") from None
        except OSError as exc:  # a file this user may not read (chmod 000): no count either
            raise InvalidInputError(WORKERS_FILE, exc.strerror, "a file ddlscale can read") from None
        data = json_object(text, WORKERS_FILE)
        only_fields(data, fields, fields, "")
        check_process(data["scheduler"], "scheduler")
        validate_int(data["http_port"], "http_port", 1, 65535)
        names = data["workers"]
        if not isinstance(names, list) or len(names) > MAX_REPLICAS or not all(
            isinstance(name, str) and 0 < len(name) <= WORKER_NAME_MAX for name in names
        ):
            raise InvalidInputError(
                "workers", names, f"a list of at most {MAX_REPLICAS} worker names of 1 to {WORKER_NAME_MAX} characters"
            )
    if data["scheduler"] != scheduler.to_json():
        return None
    return ListedWorkers(set(names), data["http_port"])


def scheduler_answers(address: str, host: str, http_port: int, timeout: float = 3.0) -> bool:
    """Whether the scheduler at ``address`` answers ``ok`` on ``/health`` of its HTTP server
    (``host:http_port``) within ``timeout`` (cut to what is left of the operation: :func:`probe_timeout`).
    A stopped or blocked scheduler still has its connections accepted by the kernel and never answers:
    False, as for one gone."""
    import http.client

    budget = probe_timeout(timeout, f"the check of scheduler {address}")
    connection = http.client.HTTPConnection(host, http_port, timeout=budget)
    try:
        connection.request("GET", "/health")
        reply = connection.getresponse()
        return reply.status == 200 and reply.read(16) == b"ok"
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


async def _call(address: str, tls: DaskTls, timeout: float, op: str, **kwargs: Any) -> Any:
    from distributed.core import rpc

    async with rpc(address, timeout=timeout, connection_args=tls.security().get_connection_args("client")) as remote:
        return await asyncio.wait_for(getattr(remote, op)(**kwargs), timeout)


def retire_workers(address: str, tls: DaskTls, names: List[str], timeout: float) -> None:
    """Ask the scheduler to move data off ``names`` and close them (``Client.retire_workers``).

    Raises :class:`BackendUnavailableError` if the scheduler does not finish in ``timeout``.
    """
    if not names:
        return
    try:
        asyncio.run(_call(address, tls, timeout, "retire_workers", names=names, close_workers=True))
    except Exception as exc:
        raise BackendUnavailableError(
            f"scheduler {address} did not retire workers {names} within {seconds(timeout)} "
            f"({type(exc).__name__})"
        ) from None
