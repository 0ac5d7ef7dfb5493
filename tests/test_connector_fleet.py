"""Many concurrent executions on one connector: their polls share one pod watch (Kubernetes) or one
cluster poll per cluster (scaler service), and the state they wait for stays in the resource metadata.

``get`` is called as the connector service calls it, 50 executions at once,
against the protocol-true test servers (the connector opens its backend from
the environment, as in a deployment).
"""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from flyteidl.core.execution_pb2 import TaskExecution
from tests.contract_support import write_kubeconfig
from tests.flyte_support import SCALER_ENV
from tests.servers.k8s_server import K8sTestServer
from tests.servers.scaler_server import DEFAULT_API_KEY

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.kubernetes._informer import running_informers
from flytekitplugins_ddlscale.connector import ScalingConnector, ScalingMetadata
from flytekitplugins_ddlscale.tasks import WAIT_TASK_TYPE

EXECUTIONS = 50


def wait_meta(cluster, backend, target):
    now = time.time()
    return ScalingMetadata(
        task_type=WAIT_TASK_TYPE, cluster=cluster, backend=backend, target=target, started=now,
        deadline=now + 60, outcome=json.dumps({"backend": backend}), framework_ready=False,
    )


def poll_all(connector, metas):
    """Each execution polled every 0.2 s (restored from its encoded metadata each time, as after a
    connector restart) until it leaves RUNNING; the final resources."""

    def one(meta):
        encoded = meta.encode()
        while True:
            resource = connector.get(ScalingMetadata.decode(encoded))
            if resource.phase != TaskExecution.RUNNING:
                return resource
            time.sleep(0.2)

    with ThreadPoolExecutor(len(metas)) as pool:
        return list(pool.map(one, metas))


@pytest.fixture
def clean(monkeypatch):
    for name in SCALER_ENV + ("KUBECONFIG",):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_fifty_executions_poll_through_one_pod_watch(clean, tmp_path):
    with K8sTestServer(ready_delay=0.02) as server:
        clean.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server.url)))
        clusters = [f"k{i}" for i in range(EXECUTIONS // 2)]
        from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

        with KubernetesBackend(kubeconfig=str(tmp_path / "kubeconfig")) as backend:
            for name in clusters:
                server.add_cluster("ray", name, replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 4})
            server.set_ready_delay(1.0)
            for name in clusters:
                backend.scale(ClusterRef("ray", name), 3, wait=False)
        server.clear_log()
        # Two executions wait on each cluster.
        metas = [wait_meta(f"ray/{clusters[i % len(clusters)]}", "kubernetes", 3) for i in range(EXECUTIONS)]
        resources = poll_all(ScalingConnector(WAIT_TASK_TYPE), metas)
        assert [r.phase for r in resources] == [TaskExecution.SUCCEEDED] * EXECUTIONS, [r.message for r in resources]
        assert {r.outputs["o0"].ready_workers for r in resources} == {3}
        pod_reads = [r for r in server.requests if r.path.endswith("/pods") and r.query.get("watch") != "true"]
        # One list of the namespace; every poll's pods came from the shared cache.
        assert [r.query.get("labelSelector") for r in pod_reads] == [None]
        assert server.peak_watches == 1
        gets = sum(1 for r in server.requests if r.method == "GET" and "/rayclusters/" in r.path)
        assert gets >= EXECUTIONS  # each poll still reads its cluster object
        (informer,) = running_informers()
        informer.stop()
        server.wait_for(lambda: not running_informers() and server.open_watches == 0, 10, "the watch to close")


def test_fifty_executions_on_the_scaler_share_cluster_polls(clean, scaler_server):
    clusters = [f"s{i}" for i in range(10)]
    for name in clusters:
        scaler_server.add_cluster("dask", name, replicas=1, max_replicas=4)
    scaler_server.set_pod_ready_delay(1.0)
    clean.setenv("CLUSTER_SCALER_BASE_URL", scaler_server.url)
    clean.setenv("DOMINO_API_KEY", DEFAULT_API_KEY)
    clean.setenv("DDLSCALE_BACKEND", "scaler")
    from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend

    with ScalerServiceBackend(scaler_server.url, api_key=DEFAULT_API_KEY, env={}) as backend:
        for name in clusters:
            backend.scale(ClusterRef("dask", name), 3, wait=False)
    scaler_server.clear_requests()
    metas = [wait_meta(f"dask/{clusters[i % len(clusters)]}", "scaler", 3) for i in range(EXECUTIONS)]
    began = time.monotonic()
    resources = poll_all(ScalingConnector(WAIT_TASK_TYPE), metas)
    took = time.monotonic() - began
    assert [r.phase for r in resources] == [TaskExecution.SUCCEEDED] * EXECUTIONS, [r.message for r in resources]
    gets = [r for r in scaler_server.requests if r.method == "GET" and "/cluster/" in r.path]
    # Five executions per cluster polling every 0.2 s: one read per cluster per second at most
    # (SHARED_MAX_AGE), plus one in flight.
    assert len(gets) <= len(clusters) * (took / 1.0 + 2), (len(gets), took)
    assert len(gets) < EXECUTIONS * took / 0.2 / 2  # unshared, every get() would read
