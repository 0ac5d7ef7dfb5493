"""Preloaded into every local Dask scheduler (``--preload <this file>``; the standard library and what the
scheduler has loaded only). It closes the scheduler once no record holds it for :func:`watch_grace` s,
gives back the claims of holders no longer running (one short ``give_back`` process), and keeps
:data:`WORKERS_FILE` (the registered workers, 0600), which every count reads without importing
``distributed``.
"""
import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

import psutil

MARK_ENV = "DDLSCALE_LOCAL_CLUSTER"
_MAX_RECORD_BYTES = 1 << 20
CHECK_EVERY = 2.0
"""Seconds between two looks at the record."""


def watch_grace() -> float:
    """Seconds the record must go on not holding this scheduler before it closes
    (``$DDLSCALE_WATCH_GRACE``, 30): the one who starts a scheduler records it right after, so only a
    start that was killed half-way leaves it unrecorded. Read when the watch starts, in the scheduler
    (the local backend checked the value before it started one), never when this module is imported."""
    return float(os.environ.get("DDLSCALE_WATCH_GRACE", "30"))


logger = logging.getLogger("distributed.scheduler")
WORKERS_FILE = "dask-workers.json"
"""The workers the scheduler has registered: ``{"scheduler": {"pid", "start"}, "http_port": port, "workers":
[names]}``, its identity being what the cluster's record holds of it (pid and start time), so a file an
earlier scheduler of the folder wrote is told apart, and the port of its HTTP server, whose ``/health`` a
reader asks to know the scheduler still answers (a stopped or blocked one leaves its last list behind)."""


def recorded_here(folder: Path, pid: int) -> Optional[bool]:
    """True when ``folder``'s ``cluster.json`` names ``pid`` as its scheduler; False when the folder or
    the record is gone or names another; None when the record cannot be read."""
    try:
        # Non-blocking, no link, a regular file only, a bounded read: a FIFO or a folder put in the record's
        # place must not stall the scheduler's event loop.
        handle = os.open(folder / "cluster.json", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    with os.fdopen(handle, "rb") as stream:
        try:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                return None
            text = stream.read(_MAX_RECORD_BYTES + 1)
        except OSError:
            return None
    try:
        data = json.loads(text) if len(text) <= _MAX_RECORD_BYTES else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or "scheduler" not in data:
        # Not a record ddlscale wrote (it always writes the field, null without a head): no verdict.
        return None
    scheduler = data.get("scheduler")
    return isinstance(scheduler, dict) and scheduler.get("pid") == pid


GIVE_BACK = (
    "import sys\n"
    "from flytekitplugins_ddlscale.backends.local import LocalBackend\n"
    "from flytekitplugins_ddlscale.refs import ClusterRef\n"
    "namespace, kind, name = sys.argv[2].split('.', 2)\n"
    "with LocalBackend(state_dir=sys.argv[1]) as backend:\n"
    "    backend.give_back(ClusterRef(kind, name, None if namespace == '_' else namespace), timeout=60)\n"
)
"""What the give-back process runs: ``give_back`` of the cluster (state directory and folder name as arguments)."""


def _process_start(pid: int) -> Optional[int]:
    """``leases.process_start`` of a running process (None for a zombie or none): the same clock ticks."""
    try:
        process = psutil.Process(pid)
        if process.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return round((process.create_time() - psutil.boot_time()) * os.sysconf("SC_CLK_TCK"))
    except psutil.Error:
        pass
    return None


def gone_holders(folder: Path) -> List[str]:
    """Claims on the cluster's record whose holder process on this host is gone (the rule of
    ``leases.holder_gone``, restated here): their ids, sorted; empty when the
    record holds none or cannot be read (a broken record is the next command's to report)."""
    records = folder.parent.parent / "records" / f"{folder.name}.json"
    try:
        claims = json.loads(json.loads(records.read_text(encoding="utf-8")).get("claims") or "{}")
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        return []
    gone = []
    for claim_id, claim in claims.items() if isinstance(claims, dict) else ():
        holder = claim.get("holder", "") if isinstance(claim, dict) else ""
        host, _, pid = str(holder).rpartition(":")
        if host != socket.gethostname() or not pid.isdigit():
            continue
        started = _process_start(int(pid))
        recorded = claim.get("holder_start")
        if started is None or (isinstance(recorded, int) and recorded != started):
            gone.append(str(claim_id))
    return sorted(gone)


def write_workers(folder: Path, identity: Dict[str, Optional[int]], http_port: int, names: Iterable[str]) -> None:
    """Replace ``folder``'s :data:`WORKERS_FILE` with ``identity``, ``http_port`` and ``names``: a new 0600
    file put in its place, so a reader sees the old list or the new one whole."""
    data = json.dumps({"scheduler": identity, "http_port": http_port, "workers": sorted(names)}).encode("utf-8")
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{WORKERS_FILE}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, folder / WORKERS_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def keep_workers_file(scheduler: Any, folder: Path) -> Callable[[], None]:
    """Write :data:`WORKERS_FILE` now (replacing an earlier scheduler's) and on every worker change.

    Returns what writes it again when its last write failed (a full disk), for the watch to call: a list
    left as it was would go on counting a worker that left, or not one that joined."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    identity = {"pid": os.getpid(), "start": _process_start(os.getpid())}
    http_port = scheduler.http_server.port
    # By address: a worker's name is gone from the scheduler's tables by the time its removal is told.
    names = {address: str(worker.name) for address, worker in scheduler.workers.items()}
    failed = False

    def write() -> None:
        nonlocal failed
        try:
            write_workers(folder, identity, http_port, names.values())
        except OSError as exc:
            if not failed:  # once, not at every retry
                logger.warning("could not write %s in %s (trying again): %s", WORKERS_FILE, folder, exc)
            failed = True
        else:
            failed = False

    def retry() -> None:
        if failed:
            write()

    class WorkersFile(SchedulerPlugin):
        name = "ddlscale-workers-file"

        def add_worker(self, scheduler: Any, worker: str) -> None:
            names[worker] = str(scheduler.workers[worker].name)
            write()

        def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
            names.pop(worker, None)
            write()

    # Both in one turn of the event loop: no worker joins between the list taken above and the plugin.
    scheduler.add_plugin(WorkersFile())
    write()
    return retry


def dask_setup(scheduler: Any) -> None:
    """Start the watch (a periodic callback the scheduler stops when it closes) and the workers file."""
    from tornado.ioloop import PeriodicCallback

    mark = os.environ.get(MARK_ENV)
    if not mark:
        return
    folder = Path(mark)
    grace = watch_grace()
    rewrite_workers_file = keep_workers_file(scheduler, folder)
    unrecorded_since: list = []
    giving_back: list = []
    """The give-back process under way, and the dead claims it was started for."""

    def give_back() -> None:
        if giving_back and giving_back[0].poll() is None:
            return  # one at a time; reaped once it ends
        gone = gone_holders(folder)
        if not gone or (giving_back and giving_back[1] == gone):
            return  # none, or the same ones a give-back already tried: the next command reports them
        logger.warning("claims %s of cluster %s: their holder is gone; giving back what they held",
                       ", ".join(gone), folder)
        process = subprocess.Popen(
            # Run in the cluster's own (private) folder: ``-c`` puts the working directory on sys.path.
            # It keeps the cluster's mark: `down` stops it with the cluster's other processes.
            [sys.executable, "-c", GIVE_BACK, str(folder.parent.parent), folder.name], cwd=str(folder),
            # Its log lines go to the scheduler's log.
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
        )
        giving_back[:] = [process, gone]

    def check() -> None:
        rewrite_workers_file()
        give_back()
        if recorded_here(folder, os.getpid()) is not False:
            unrecorded_since.clear()
            return
        if not unrecorded_since:
            unrecorded_since.append(time.monotonic())
        if time.monotonic() - unrecorded_since[0] >= grace:
            logger.warning("closing: no record of cluster %s holds this scheduler (for %.0fs)", folder, grace)
            scheduler.periodic_callbacks.pop("ddlscale-watch").stop()
            asyncio.ensure_future(scheduler.close(reason="its local cluster's record no longer holds it"))

    scheduler.periodic_callbacks["ddlscale-watch"] = PeriodicCallback(check, CHECK_EVERY * 1000)
