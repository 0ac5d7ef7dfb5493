"""Many concurrent executions on one connector: their polls share one watch per resource (Kubernetes: pods
and cluster objects, so a steady-state poll sends no request) or one cluster poll per cluster (scaler
service), and the state they wait for stays in the resource metadata.

``get`` is called as the connector service calls it, 50 executions at once,
against the protocol-true test servers (the connector opens its backend from
the environment, as in a deployment).
"""
import asyncio
import json
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import pytest
from flyteidl.core.execution_pb2 import TaskExecution
from tests.contract_support import write_kubeconfig
from tests.flyte_support import SCALER_ENV
from tests.servers.k8s_fixtures import role_rules
from tests.servers.k8s_server import K8sTestServer
from tests.servers.scaler_server import DEFAULT_API_KEY

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.kubernetes._informer import running_informers
from flytekitplugins_ddlscale.connector import ScalingConnector, ScalingMetadata
from flytekitplugins_ddlscale.tasks import WAIT_TASK_TYPE

EXECUTIONS = 50
DASK_OPERATOR_ROLE = Path(__file__).resolve().parents[1] / "examples" / "k8s" / "dask-operator-rbac.yaml"


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
            resource = asyncio.run(connector.get(ScalingMetadata.decode(encoded)))
            if resource.phase != TaskExecution.RUNNING:
                return resource
            time.sleep(0.2)

    with ThreadPoolExecutor(len(metas)) as pool:
        return list(pool.map(one, metas))


def answered_on_the_loop(connector, encoded):
    """One step of ``get`` on a running event loop: the resource when it finished without awaiting
    anything (answered from memory on the loop itself), None when it awaited a reader thread."""

    async def one_step():
        call = connector.get(ScalingMetadata.decode(encoded))
        try:
            call.send(None)
        except StopIteration as done:
            return done.value
        call.close()
        return None

    return asyncio.run(one_step())


@pytest.fixture
def clean(monkeypatch):
    for name in SCALER_ENV + ("KUBECONFIG",):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def informers_of(server):
    """The informers on ``server`` (an earlier test's may still be stopping)."""
    return [i for i in running_informers(None) if i.key[0] == server.url]


def stop_informers(server):
    for informer in informers_of(server):
        informer.stop()
    server.wait_for(lambda: not informers_of(server) and server.open_watches == 0, 10, "the watches to close")


def test_fifty_executions_poll_through_one_watch_per_resource(clean, tmp_path):
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
        assert server.peak_watches_per_resource == 1
        # The cluster objects come from the shared cache once it has listed them: a poll before that reads
        # the server, none after it does.
        gets = sum(1 for r in server.requests if r.method == "GET" and "/rayclusters/" in r.path)
        assert gets <= EXECUTIONS
        stop_informers(server)


DASK_OPERATOR = "kubernetes.dask.org"
KINDS = {
    # kind: (the objects the caches hold besides pods, the one holding the size, what a deletion removes)
    "ray": ({"rayclusters"}, "rayclusters/k", [("rayclusters", "k")]),
    "dask-operator": (
        {"daskworkergroups", "daskautoscalers"}, "daskworkergroups/k-default",
        [(f"daskclusters.{DASK_OPERATOR}", "k"), (f"daskworkergroups.{DASK_OPERATOR}", "k-default")],
    ),
}


def add_cluster(server, kind):
    """Cluster ``k`` of ``kind`` with 2 workers, bounds 2..4 (the Dask operator's in a DaskAutoscaler)."""
    if kind == "dask-operator":
        server.add_dask_operator("k", replicas=2, autoscaler={"minimum": 2, "maximum": 4})
    else:
        server.add_cluster(kind, "k", replicas=2, autoscaling={"minReplicas": 2, "maxReplicas": 4})


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_steady_state_poll_sends_no_request_and_a_deleted_cluster_fails(clean, tmp_path, kind):
    cached, sized, deleted = KINDS[kind]
    with K8sTestServer(ready_delay=0.02) as server:
        clean.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server.url)))
        add_cluster(server, kind)
        if kind == "dask-operator":
            server.allow_only(role_rules(DASK_OPERATOR_ROLE))  # the shipped Role is enough for the caches
        server.set_ready_delay(3600)  # the third worker never gets Ready here: every poll is RUNNING
        from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

        with KubernetesBackend(kubeconfig=str(tmp_path / "kubeconfig")) as backend:
            backend.scale(ClusterRef(kind, "k"), 3, wait=False)
        connector = ScalingConnector(WAIT_TASK_TYPE)
        encoded = wait_meta(f"{kind}/k", "kubernetes", 3).encode()
        first = asyncio.run(connector.get(ScalingMetadata.decode(encoded)))
        assert first.phase == TaskExecution.RUNNING, first.message
        server.wait_for(
            lambda: {i.resource.plural for i in informers_of(server)} == cached | {"pods"}
            and all(i.synced.is_set() for i in informers_of(server)),
            10, "the pod and cluster-object caches to sync",
        )
        server.clear_log()
        for _ in range(20):
            resource = answered_on_the_loop(connector, encoded)
            assert resource is not None, "a poll the caches can answer waited for a reader thread"
            assert resource.phase == TaskExecution.RUNNING, resource.message
        # Nothing but the informers' own watches (one may open just after its list): no read at all.
        assert [r for r in server.requests if r.query.get("watch") != "true"] == []
        assert all(r.status != 403 for r in server.requests)
        # The watch says the cluster is gone: the poll reads the server, which says so.
        for resource, name in deleted:
            server.commit(resource, "domino-compute", None, name, "DELETED")
        (objects,) = [i for i in informers_of(server) if i.resource.plural == sized.split("/")[0]]
        server.wait_for(lambda: objects.fresh(sized.split("/")[1]) is None, 10, "the watch to report the deletion")
        resource = asyncio.run(connector.get(ScalingMetadata.decode(encoded)))
        assert resource.phase == TaskExecution.FAILED and "not found" in resource.message, resource.message
        assert [r.method for r in server.requests if f"/{sized}" in r.path] == ["GET"]
        stop_informers(server)


def test_a_role_without_watch_on_daskautoscalers_reads_them_from_the_server(clean, tmp_path):
    """The Role shipped before the caches read DaskAutoscalers (get, list, patch): every poll lists them,
    refused once, not on every poll."""
    with K8sTestServer(ready_delay=0.02) as server:
        clean.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server.url)))
        add_cluster(server, "dask-operator")
        server.allow_only(role_rules(DASK_OPERATOR_ROLE) - {("watch", f"daskautoscalers.{DASK_OPERATOR}")})
        server.set_ready_delay(3600)
        from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

        with KubernetesBackend(kubeconfig=str(tmp_path / "kubeconfig")) as backend:
            backend.scale(ClusterRef("dask-operator", "k"), 3, wait=False)
        connector = ScalingConnector(WAIT_TASK_TYPE)
        encoded = wait_meta("dask-operator/k", "kubernetes", 3).encode()
        assert asyncio.run(connector.get(ScalingMetadata.decode(encoded))).phase == TaskExecution.RUNNING
        server.wait_for(
            lambda: {i.resource.plural for i in informers_of(server)} == {"pods", "daskworkergroups"}
            and all(i.synced.is_set() for i in informers_of(server)),
            10, "the refused informer to stop and the others to sync",
        )
        server.clear_log()
        polls = [asyncio.run(connector.get(ScalingMetadata.decode(encoded))) for _ in range(5)]
        assert {p.phase for p in polls} == {TaskExecution.RUNNING}
        scalers = [r for r in server.requests if r.path.endswith("/daskautoscalers")]
        assert [(r.query.get("watch"), r.status) for r in scalers] == [(None, 200)] * 5
        stop_informers(server)


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
    # (SHARED_READS.max_age), plus one in flight.
    assert len(gets) <= len(clusters) * (took / 1.0 + 2), (len(gets), took)
    assert len(gets) < EXECUTIONS * took / 0.2 / 2  # unshared, every get() would read


def test_a_scaler_poll_answered_by_another_executions_fresh_read_is_answered_on_the_loop(clean, scaler_server):
    """The first execution's poll reads the cluster in a reader thread; another execution's poll of the
    same cluster within the shared read's age (1 s) takes that read on the loop itself, sending nothing."""
    scaler_server.add_cluster("dask", "s", replicas=1, max_replicas=4)
    scaler_server.set_pod_ready_delay(3600)  # the new workers never get Ready here: every poll is RUNNING
    clean.setenv("CLUSTER_SCALER_BASE_URL", scaler_server.url)
    clean.setenv("DOMINO_API_KEY", DEFAULT_API_KEY)
    clean.setenv("DDLSCALE_BACKEND", "scaler")
    from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend

    with ScalerServiceBackend(scaler_server.url, api_key=DEFAULT_API_KEY, env={}) as backend:
        backend.scale(ClusterRef("dask", "s"), 3, wait=False)
    connector = ScalingConnector(WAIT_TASK_TYPE)
    first, other = (wait_meta("dask/s", "scaler", 3).encode() for _ in range(2))
    # The shared read may be older than its 1 s by the time the other poll comes on a loaded machine:
    # a few rounds, each a fresh read then the other execution's poll.
    for _ in range(5):
        assert asyncio.run(connector.get(ScalingMetadata.decode(first))).phase == TaskExecution.RUNNING
        scaler_server.clear_requests()
        resource = answered_on_the_loop(connector, other)
        if resource is not None:
            break
    assert resource is not None, "no poll was answered from the other execution's read"
    assert resource.phase == TaskExecution.RUNNING and "waiting for 3 workers" in resource.message, resource.message
    assert scaler_server.requests == []


def test_a_poll_waits_while_the_dask_operator_has_not_made_the_default_worker_group(clean, tmp_path):
    """A DaskCluster whose operator has not yet created its default DaskWorkerGroup is a cluster still
    coming up: the wait node stays RUNNING saying so (as a backend wait does), then succeeds."""
    with K8sTestServer(ready_delay=0.02) as server:
        clean.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server.url)))
        server.set_dask_operator_held("k", True)
        server.add_dask_operator("k", replicas=2, wait_ready=False)
        connector = ScalingConnector(WAIT_TASK_TYPE)
        encoded = wait_meta("dask-operator/k", "kubernetes", 2).encode()
        pending = asyncio.run(connector.get(ScalingMetadata.decode(encoded)))
        assert pending.phase == TaskExecution.RUNNING, pending.message
        assert "Pending (waiting for the Dask operator to create DaskWorkerGroup 'k-default')" in pending.message
        server.set_dask_operator_held("k", False)
        (done,) = poll_all(connector, [ScalingMetadata.decode(encoded)])
        assert done.phase == TaskExecution.SUCCEEDED, done.message
        stop_informers(server)


def test_a_poll_of_a_missing_dask_cluster_fails_not_found(clean, tmp_path):
    with K8sTestServer(ready_delay=0.02) as server:
        clean.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server.url)))
        connector = ScalingConnector(WAIT_TASK_TYPE)
        resource = asyncio.run(connector.get(ScalingMetadata.decode(wait_meta("dask-operator/k", "kubernetes", 2).encode())))
        assert resource.phase == TaskExecution.FAILED and "not found" in resource.message, resource.message
        stop_informers(server)
