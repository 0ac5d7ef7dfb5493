"""Child process of the scaler fleet benchmark: one process scaling many clusters through the service at once.

Run as ``python -m benchmarks.fleet_scaler_client URL API_KEY COUNT REPLICAS STATE_DIR``. One
:class:`ScalerServiceBackend` scales clusters ``c000``.. (Dask) concurrently (one thread each,
released together) with ``wait=True`` and prints one JSON document: when each call started and
returned, and any error. The previous design's run uses this same harness on the previous plugin code.
"""
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict

from benchmarks.k8s_scale_client import cluster_name, peak_rss_kb


def main(url: str, api_key: str, count: int, replicas: int, state_dir: str, timeout: float = 300.0) -> Dict[str, Any]:
    """Scale ``count`` clusters to ``replicas`` concurrently and wait; return timings and errors."""
    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend

    backend = ScalerServiceBackend(url, api_key=api_key, state_dir=state_dir)
    gate = threading.Barrier(count)

    def one(index: int) -> Dict[str, Any]:
        name = cluster_name(index)
        gate.wait(timeout=60)
        started = time.time()
        try:
            backend.scale(ClusterRef("dask", name), replicas, wait=True, timeout=timeout)
            return {"cluster": name, "started": started, "returned": time.time(), "error": None}
        except Exception as exc:  # reported per cluster; the parent counts failures
            return {"cluster": name, "started": started, "returned": time.time(), "error": repr(exc)}

    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="scale") as pool:
        calls = list(pool.map(one, range(count)))
    backend.close()
    return {"calls": calls, "peak_rss_kb": peak_rss_kb()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])))
