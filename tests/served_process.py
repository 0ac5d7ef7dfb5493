"""A server a test starts in another process: waiting until it serves gRPC, and stopping it."""
import subprocess
import time
from typing import IO, Any, Optional

import grpc


def log_tail(log: IO[bytes]) -> str:
    """The last 3,000 characters a process wrote to ``log`` (a file it writes to)."""
    log.seek(0)
    return log.read().decode(errors="replace")[-3000:]


def wait_serving(channel: Any, proc: subprocess.Popen, log: IO[bytes], timeout: float, what: str) -> Optional[str]:
    """None once ``channel`` connects; the end of ``log`` if ``proc`` exits first. AssertionError naming
    ``what`` with the end of its log after ``timeout`` seconds."""
    ready = grpc.channel_ready_future(channel)
    end = time.monotonic() + timeout
    while proc.poll() is None:
        try:
            ready.result(timeout=min(0.5, max(0.0, end - time.monotonic())))
            return None
        except grpc.FutureTimeoutError:
            if time.monotonic() > end:
                raise AssertionError(f"{what} did not accept connections within {timeout:g} s: {log_tail(log)}")
    ready.cancel()
    return log_tail(log)


def stop_process(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; returns once ``proc`` has exited."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)
