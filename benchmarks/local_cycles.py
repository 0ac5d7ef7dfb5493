"""Up/down cycles of one real local cluster: what the ``local_*`` benchmarks time.

The head is created once (timed apart), then each cycle scales it from no
workers to ``workers`` ready ones with ``wait=True`` (as the head reports
them) and back to none. Every process is stopped afterwards, whatever
happens.
"""
import tempfile
import time
from pathlib import Path
from typing import Dict, List

HEAD = "head_s"
UP = "up_s"
DOWN = "down_s"


def time_cycles(kind: str, name: str, workers: int, cycles: int, timeout: float = 300.0) -> Dict[str, List[float]]:
    """Seconds per step: the head's start (``HEAD``, once), each ``0 -> workers`` ready (``UP``) and
    each ``workers -> 0`` (``DOWN``). Raises RuntimeError when a scale returns short of its target."""
    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    ref = ClusterRef(kind, name)
    times: Dict[str, List[float]] = {HEAD: [], UP: [], DOWN: []}
    with tempfile.TemporaryDirectory(prefix="ddlscale-bench-") as tmp:
        backend = LocalBackend(state_dir=Path(tmp) / "local")
        try:
            started = time.perf_counter()
            backend.up(ref, 0, timeout=timeout)
            times[HEAD].append(time.perf_counter() - started)
            for _ in range(cycles):
                started = time.perf_counter()
                result = backend.scale(ref, workers, wait=True, timeout=timeout)
                times[UP].append(time.perf_counter() - started)
                if result.final.ready_workers != workers:
                    raise RuntimeError(f"{kind}: scale returned with {result.final.describe()}")
                started = time.perf_counter()
                result = backend.scale(ref, 0, wait=True, timeout=timeout)
                times[DOWN].append(time.perf_counter() - started)
                if result.final.existing_workers != 0:
                    raise RuntimeError(f"{kind}: scale returned with {result.final.describe()}")
        finally:
            backend.shutdown_all()
            backend.close()
    return times
