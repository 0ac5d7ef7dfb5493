"""Child process of the 200-cluster benchmark: one process scaling many clusters at once.

Run as ``python -m benchmarks.k8s_scale_client URL COUNT REPLICAS``. It
builds one :class:`KubernetesBackend` for the API server at ``URL``, scales
clusters ``c000``.. concurrently (one thread each, released together) to
``REPLICAS`` workers with ``wait=True``, and prints one JSON document:
when each call returned (``time.time()``), any errors, and this process's
peak RSS. It runs apart from the test server so that the RSS is the
client's alone.
"""
import json
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict

NAMESPACE = "domino-compute"
OWNER = "owner-1"


def peak_rss_kb() -> int:
    """This process's peak resident set size in KiB.

    Linux: ``VmHWM`` of ``/proc/self/status``, the high-water mark of this
    program's own address space. Not ``getrusage``'s ``ru_maxrss``: on Linux
    it survives ``exec`` and so starts at the forking parent's size.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def cluster_name(index: int) -> str:
    """Name of the ``index``-th benchmark cluster."""
    return f"c{index:03d}"


def main(url: str, count: int, replicas: int, timeout: float = 180.0, wait: bool = True) -> Dict[str, Any]:
    """Scale ``count`` clusters to ``replicas`` concurrently (``wait``: until their workers are Ready);
    return timings, errors and peak RSS."""
    from kubernetes import client

    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

    config = client.Configuration(host=url)
    # One pooled connection per concurrent wait, or waits queue for connections.
    config.connection_pool_maxsize = count + 8
    backend = KubernetesBackend(NAMESPACE, api_client=client.ApiClient(config), owner=OWNER)
    rss_before_kb = peak_rss_kb()
    gate = threading.Barrier(count)

    def one(index: int) -> Dict[str, Any]:
        name = cluster_name(index)
        gate.wait(timeout=60)
        started = time.time()
        try:
            backend.scale(ClusterRef("ray", name, NAMESPACE), replicas, wait=wait, timeout=timeout)
            return {"cluster": name, "started": started, "returned": time.time(), "error": None}
        except Exception as exc:  # reported per cluster; the parent counts failures
            return {"cluster": name, "started": started, "returned": time.time(), "error": repr(exc)}

    began = time.time()
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="scale") as pool:
        calls = list(pool.map(one, range(count)))
    backend.close()
    return {
        "began": began,
        "calls": calls,
        "rss_before_kb": rss_before_kb,
        "peak_rss_kb": peak_rss_kb(),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
