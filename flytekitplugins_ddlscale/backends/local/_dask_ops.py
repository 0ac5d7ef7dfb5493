"""Talking to a local Dask scheduler, and the command lines that start Dask processes.

``distributed`` is imported inside the functions: this module is imported by
the local backend, which ``get_backend()`` may load in processes that never
touch a cluster. Each call opens one connection in a private event loop and
closes it, so nothing (no thread, no loop) outlives the call.
"""
import asyncio
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from ...errors import BackendUnavailableError
from ..._core.wording import seconds
from ..._core.waiting import probe_timeout

WATCH_PRELOAD = Path(__file__).with_name("_dask_watch.py")
"""The scheduler preload that closes a scheduler no record holds (:mod:`.dask_watch`)."""


def scheduler_argv(host: str, port: int, scheduler_file: str) -> List[str]:
    """``dask scheduler`` on ``host:port`` that also writes its address to ``scheduler_file``

    (for ``Client(scheduler_file=...)``; it also puts the cluster's folder in the command line).
    Without a dashboard a scheduler still serves HTTP (health, metrics, call stacks) on
    ``--dashboard-address``, every interface at 8787 by default: it is held to ``host`` on a
    port the OS picks. It preloads :mod:`.dask_watch`, so it closes itself once no record of its
    cluster holds it.
    """
    return [
        sys.executable, "-m", "distributed.cli.dask_scheduler",
        "--host", host,
        "--port", str(port),
        "--no-dashboard",
        "--dashboard-address", f"{host}:0",
        "--scheduler-file", scheduler_file,
        "--preload", str(WATCH_PRELOAD),
    ]


def worker_argv(
    address: str, name: str, nthreads: int, memory_limit: int, local_directory: str, host: str
) -> List[str]:
    """One ``dask worker`` process (no nanny, so one pid per worker) named ``name``.

    ``--death-timeout`` bounds how long a worker waits for a scheduler that is
    gone, so an orphaned worker exits on its own. Its HTTP server (served even
    without a dashboard, on every interface by default) is held to ``host``.
    """
    return [
        sys.executable, "-m", "distributed.cli.dask_worker", address,
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


async def _call(address: str, timeout: float, op: str, **kwargs: Any) -> Any:
    from distributed.core import rpc

    async with rpc(address, timeout=timeout) as remote:
        return await asyncio.wait_for(getattr(remote, op)(**kwargs), timeout)


def scheduler_workers(address: str, timeout: float = 3.0) -> Optional[Dict[str, Dict[str, Any]]]:
    """Workers the scheduler at ``address`` sees, by worker name; None if it does not answer."""
    try:
        info = asyncio.run(_call(address, probe_timeout(timeout, f"the check of scheduler {address}"), "identity"))
    except (OSError, asyncio.TimeoutError):
        # distributed's CommClosedError is an OSError: all mean "not answering".
        return None
    return {str(w["name"]): w for w in info.get("workers", {}).values()}


def retire_workers(address: str, names: List[str], timeout: float) -> None:
    """Ask the scheduler to move data off ``names`` and close them (``Client.retire_workers``).

    Raises :class:`BackendUnavailableError` if the scheduler does not finish in ``timeout``.
    """
    if not names:
        return
    try:
        asyncio.run(_call(address, timeout, "retire_workers", names=names, close_workers=True))
    except Exception as exc:
        raise BackendUnavailableError(
            f"scheduler {address} did not retire workers {names} within {seconds(timeout)} "
            f"({type(exc).__name__})"
        ) from None
