"""A new local Dask cluster's scheduler process, which first forks the cluster's first workers.

Every Dask process imports ``distributed`` (half a second of CPU); a cluster
of a scheduler and four workers started as five programs pays that five times
over, where Dask's own ``LocalCluster`` pays it in one process before it
starts its workers. This program imports it once. Its standard input is a
Unix socket to the ``ddlscale`` command that started it
(:class:`~._procs.ForkingHead`); on it come requests, one JSON line each,
``{"args": [...]}`` with the worker's log file's descriptor attached. For each,
it forks a worker that runs ``dask worker`` with those arguments and answers
``{"pid": n}`` (or ``{"error": "..."}``). When the command closes the socket,
this process becomes the scheduler: ``dask scheduler`` with the arguments it
was given. A worker forked after the command stopped waiting for it (its
answer cannot be sent) is killed at once: no record would hold it.

A worker is forked from a process that has imported ``distributed`` and
started nothing (no thread, no event loop), as ``multiprocessing``'s
forkserver does. It is forked twice (the middle process exits at once), so
it is never this scheduler's child, runs in a session of its own, has its
log as stdout and stderr and nothing else open, and inherits this process's
environment: the cluster's allow-listed variables and mark
(:func:`~._procs.spawn_detached`), as a worker started on its own has.

Loaded by path (``python -P <this file>``), not as a module of this package:
it imports the standard library and ``distributed`` only.
"""
import json
import os
import runpy
import signal
import socket
import sys
import traceback
from typing import List, NoReturn, Tuple

WORKER_MODULE = "distributed.cli.dask_worker"
SCHEDULER_MODULE = "distributed.cli.dask_scheduler"
REQUEST_MAX = 1 << 16
"""Bytes of one request (a worker's arguments: a few hundred)."""


def _run(module: str, args: List[str]) -> NoReturn:
    """Run ``python -m module args`` in this process and exit with its status."""
    sys.argv = [module, *args]
    status = 1
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def fork_worker(args: List[str], log: int) -> int:
    """Fork a worker running ``dask worker args`` with ``log`` as its output; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            worker = os.fork()
            if worker == 0:
                os.setsid()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.closerange(3, os.sysconf("SC_OPEN_MAX"))
                _run(WORKER_MODULE, args)
            os.write(write_end, str(worker).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        answer = os.read(read_end, 32)
    finally:
        os.close(read_end)
        os.waitpid(middle, 0)
    if not answer:
        raise OSError("the worker could not be forked")
    return int(answer)


def _request(channel: socket.socket) -> Tuple[bytes, List[int]]:
    """One request line and the descriptors sent with it; ``b""`` once the command closed the socket."""
    line, descriptors = b"", []
    while not line.endswith(b"\n"):
        data, fds, _, _ = socket.recv_fds(channel, REQUEST_MAX, 1)
        descriptors.extend(fds)
        if not data:
            return b"", descriptors
        line += data
        if len(line) > REQUEST_MAX:
            raise ValueError(f"a request over {REQUEST_MAX} bytes")
    return line, descriptors


def serve(channel: socket.socket) -> None:
    """Fork a worker for each request on ``channel`` until it is closed."""
    while True:
        line, descriptors = _request(channel)
        try:
            if not line:
                return
            try:
                args = json.loads(line)["args"]
                if len(descriptors) != 1 or not all(isinstance(arg, str) for arg in args):
                    raise ValueError("a request is {\"args\": [strings]} with one log descriptor")
                answer = {"pid": fork_worker(args, descriptors[0])}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                channel.sendall(json.dumps(answer).encode() + b"\n")
            except OSError:
                # The command stopped waiting (its time ran out, or it was killed) before it learned this
                # worker's pid: no record will hold it, so it does not run.
                if "pid" in answer:
                    os.kill(answer["pid"], signal.SIGKILL)
                return
        finally:
            for descriptor in descriptors:
                os.close(descriptor)


def main() -> NoReturn:
    channel = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    import distributed.cli.dask_scheduler  # noqa: F401  (what the forked workers and the scheduler share)
    import distributed.cli.dask_worker  # noqa: F401

    try:
        serve(channel)
    finally:
        channel.close()
    _run(SCHEDULER_MODULE, sys.argv[1:])


if __name__ == "__main__":
    main()
