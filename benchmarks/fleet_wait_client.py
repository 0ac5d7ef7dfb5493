"""Child process of the fleet benchmark: one process running a wait on each of many clusters at once.

Run as ``python -m benchmarks.fleet_wait_client TARGET COUNT REPLICAS SENDERS``, ``TARGET`` the API
server's URL (the test server) or a kubeconfig file (a real API server's user). Each of ``COUNT``
threads sends its cluster's scale request (``wait=False``; at most ``SENDERS`` requests in flight,
so the API server's write path is not what is measured) and then waits for the workers with
``wait_for_workers``. The pods take longer to become Ready than all the requests take to send, so
the waits overlap. Prints one JSON document: per cluster when its wait started and returned and any
error, the most waits running at once, and this process's peak RSS. The previous design's run uses
this same harness on the previous plugin code.
"""
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict

from benchmarks.k8s_scale_client import NAMESPACE, OWNER, cluster_name, peak_rss_kb


def main(target: str, count: int, replicas: int, senders: int, timeout: float = 600.0) -> Dict[str, Any]:
    """Scale then wait on ``count`` clusters concurrently; return timings, errors, peak waits and peak RSS."""
    from kubernetes import client
    from kubernetes import config as kubeconfig

    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

    if os.path.isfile(target):
        config = client.Configuration()
        kubeconfig.load_kube_config(config_file=target, client_configuration=config)
    else:
        config = client.Configuration(host=target)
    config.connection_pool_maxsize = count + 8
    backend = KubernetesBackend(NAMESPACE, api_client=client.ApiClient(config), owner=OWNER, request_timeout=120)
    rss_before_kb = peak_rss_kb()
    sending = threading.Semaphore(senders)
    lock = threading.Lock()
    running = {"now": 0, "peak": 0}

    def one(index: int) -> Dict[str, Any]:
        ref = ClusterRef("ray", cluster_name(index), NAMESPACE)
        try:
            with sending:
                backend.scale(ref, replicas, wait=False, timeout=timeout)
        except Exception as exc:  # reported per cluster; the parent counts failures
            return {"cluster": ref.name, "started": time.time(), "returned": time.time(), "error": f"scale: {exc!r}"}
        with lock:
            running["now"] += 1
            running["peak"] = max(running["peak"], running["now"])
        started = time.time()
        try:
            backend.wait_for_workers(ref, replicas, timeout=timeout)
            return {"cluster": ref.name, "started": started, "returned": time.time(), "error": None}
        except Exception as exc:
            return {"cluster": ref.name, "started": started, "returned": time.time(), "error": repr(exc)}
        finally:
            with lock:
                running["now"] -= 1

    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="wait") as pool:
        calls = list(pool.map(one, range(count)))
    backend.close()
    return {"calls": calls, "peak_waits": running["peak"], "rss_before_kb": rss_before_kb, "peak_rss_kb": peak_rss_kb()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
