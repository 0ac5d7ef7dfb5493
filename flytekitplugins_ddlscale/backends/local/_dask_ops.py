"""Talking to a local Dask scheduler, and the command lines that start Dask processes.

``distributed`` is imported inside the functions: this module is imported by
the local backend, which ``get_backend()`` may load in processes that never
touch a cluster. Each call opens one connection in a private event loop and
closes it, so nothing (no thread, no loop) outlives the call.

Every process speaks ``tls://`` with the cluster's certificate
(:mod:`.dask_tls`), and so does every call here: a scheduler or worker
refuses a peer without it.
"""
import asyncio
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..._core import settings
from ...errors import BackendUnavailableError
from ..._core.wording import seconds
from ..._core.waiting import probe_timeout
from ._dask_tls import DaskTls
from ._procs import python_module, with_environment

SCHEDULER_HTTP_ROUTES = ("distributed.http.health", "distributed.http.scheduler.json", "distributed.http.scheduler.prometheus")
"""What the scheduler's HTTP server (unauthenticated: Dask's TLS covers its comms only) serves: health,
counts and metrics. Not Dask's default ``info`` pages (worker logs, call stacks, task keys, readable by
any local user) nor its ``proxy`` to the workers' pages."""
WATCH_PRELOAD = Path(__file__).with_name("_dask_watch.py")
"""The scheduler preload that closes a scheduler no record holds (:mod:`.dask_watch`)."""


def scheduler_argv(host: str, port: int, scheduler_file: str, tls: DaskTls) -> List[str]:
    """``dask scheduler`` on ``tls://host:port`` that also writes its address to ``scheduler_file``

    (for ``Client(scheduler_file=...)``; it also puts the cluster's folder in the command line).
    Without a dashboard a scheduler still serves HTTP (health, metrics, call stacks) on
    ``--dashboard-address``, every interface at 8787 by default: it is held to ``host`` on a
    port the OS picks. It preloads :mod:`.dask_watch`, so it closes itself once no record of its
    cluster holds it. It takes only peers presenting a certificate of ``tls``'s authority
    (encryption required: Dask requires it whenever TLS files are given); its HTTP server
    serves :data:`SCHEDULER_HTTP_ROUTES` only.
    """
    routes = {settings.DASK_SCHEDULER_HTTP_ROUTES.name: repr(list(SCHEDULER_HTTP_ROUTES))}
    return with_environment(routes, [
        *python_module("distributed.cli.dask_scheduler"),
        "--host", host,
        "--port", str(port),
        "--protocol", "tls",
        *tls.argv(),
        "--no-dashboard",
        "--dashboard-address", f"{host}:0",
        "--scheduler-file", scheduler_file,
        "--preload", str(WATCH_PRELOAD),
    ])


def worker_argv(
    address: str, name: str, nthreads: int, memory_limit: int, local_directory: str, host: str, tls: DaskTls
) -> List[str]:
    """One ``dask worker`` process (no nanny, so one pid per worker) named ``name``.

    ``--death-timeout`` bounds how long a worker waits for a scheduler that is
    gone, so an orphaned worker exits on its own. Its HTTP server (served even
    without a dashboard, on every interface by default) is held to ``host``. It connects and
    listens with ``tls``'s certificate, ``tls://`` only (a worker runs what a peer sends it).
    """
    return [
        *python_module("distributed.cli.dask_worker"), address,
        "--protocol", "tls",
        *tls.argv(),
        "--name", name,
        "--nthreads", str(nthreads),
        "--memory-limit", str(memory_limit),
        "--no-nanny",
        "--no-dashboard",
        "--dashboard-address", f"{host}:0",
        "--host", host,
        "--local-directory", local_directory,
        "--death-timeout", "60",
    ]


async def _call(address: str, tls: Optional[DaskTls], timeout: float, op: str, **kwargs: Any) -> Any:
    from distributed.core import rpc

    connection_args = tls.security().get_connection_args("client") if tls is not None else None
    async with rpc(address, timeout=timeout, connection_args=connection_args) as remote:
        return await asyncio.wait_for(getattr(remote, op)(**kwargs), timeout)


def scheduler_workers(
    address: str, tls: Optional[DaskTls], timeout: float = 3.0
) -> Optional[Dict[str, Dict[str, Any]]]:
    """Workers the scheduler at ``address`` sees, by worker name, asked with ``tls``'s certificate
    (None: over plain ``tcp://``, for a scheduler this backend did not start); None if it does not
    answer."""
    try:
        info = asyncio.run(_call(address, tls, probe_timeout(timeout, f"the check of scheduler {address}"), "identity"))
    except (OSError, asyncio.TimeoutError):
        # distributed's CommClosedError is an OSError: all mean "not answering".
        return None
    return {str(w["name"]): w for w in info.get("workers", {}).values()}


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
