"""Framework readiness: workers registered with Dask, Ray or Spark, not just pods Ready.

A pod can be Ready before its worker process has joined the scheduler. These
checks use the connection variables Domino injects (and the local backend
exports) and run only where the client library is installed; each is
bounded by the time the phase has left.
"""
import importlib.util
import json
import logging
import os
import time
import urllib.request
from typing import Mapping, Optional

from ..errors import ScalingTimeoutError

logger = logging.getLogger("flytekitplugins_ddlscale")

DASK_HOST, DASK_PORT = "DASK_SCHEDULER_SERVICE_HOST", "DASK_SCHEDULER_SERVICE_PORT"
RAY_HOST, RAY_PORT = "RAY_HEAD_SERVICE_HOST", "RAY_HEAD_SERVICE_PORT"
SPARK_HOST, SPARK_UI_PORT = "SPARK_MASTER_SERVICE_HOST", "SPARK_MASTER_WEBUI_PORT"
DEFAULT_SPARK_UI_PORT = "8080"


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def wait_framework_ready(
    kind: str, workers: int, timeout: float, env: Optional[Mapping[str, str]] = None
) -> Optional[str]:
    """Wait until ``workers`` workers are registered with the ``kind`` framework.

    Returns a description of the check that passed, or None when no check
    applies (no connection variables, client library missing, or zero
    workers). Raises :class:`ScalingTimeoutError` after ``timeout`` seconds.
    """
    environ = os.environ if env is None else env
    if workers <= 0:
        return None
    if kind == "dask" and environ.get(DASK_HOST) and _installed("distributed"):
        return _dask(f"tcp://{environ[DASK_HOST]}:{environ.get(DASK_PORT, '8786')}", workers, timeout)
    if kind == "ray" and environ.get(RAY_HOST) and _installed("ray"):
        return _ray(f"ray://{environ[RAY_HOST]}:{environ.get(RAY_PORT, '10001')}", workers, timeout)
    if kind == "spark" and environ.get(SPARK_HOST):
        url = f"http://{environ[SPARK_HOST]}:{environ.get(SPARK_UI_PORT, DEFAULT_SPARK_UI_PORT)}/json/"
        return _spark(url, workers, timeout)
    return None


def _dask(address: str, workers: int, timeout: float) -> str:
    from distributed import Client

    what = f"{workers} workers registered with the Dask scheduler at {address}"
    started = time.monotonic()
    try:
        with Client(address, timeout=timeout, set_as_default=False) as client:
            client.wait_for_workers(n_workers=workers, timeout=max(0.1, timeout - (time.monotonic() - started)))
    except (TimeoutError, OSError) as exc:
        raise ScalingTimeoutError(f"timed out after {timeout:.0f}s waiting for {what}: {exc}") from exc
    return what


def _ray(address: str, workers: int, timeout: float) -> str:
    import ray

    what = f"{workers} alive Ray worker nodes at {address}"
    deadline = time.monotonic() + timeout
    ray.init(address=address, ignore_reinit_error=True, logging_level=logging.WARNING)
    try:
        while True:
            alive = sum(1 for node in ray.nodes() if node.get("Alive")) - 1
            if alive >= workers:
                return what
            if time.monotonic() >= deadline:
                raise ScalingTimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; {alive} alive")
            time.sleep(1.0)
    finally:
        ray.shutdown()


def _spark(url: str, workers: int, timeout: float) -> Optional[str]:
    what = f"{workers} ALIVE workers on the Spark master ({url})"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=min(5.0, max(0.1, deadline - time.monotonic()))) as reply:
                alive = int(json.load(reply).get("aliveworkers", 0))
        except OSError as exc:
            # The master UI is optional on some deployments; pod readiness already holds.
            logger.info("Spark master UI %s not reachable (%s); skipping framework readiness", url, exc)
            return None
        if alive >= workers:
            return what
        if time.monotonic() >= deadline:
            raise ScalingTimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; {alive} alive")
        time.sleep(1.0)
