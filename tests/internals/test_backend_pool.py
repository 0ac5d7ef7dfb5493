"""The connector's kept backends (:class:`~flytekitplugins_ddlscale._services.opening.BackendPool`), against the
Kubernetes test server: polls share one API client and its connections, a changed environment gets a
backend of its own, and backends are closed only when idle and out of room.
"""
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from flyteidl.core.execution_pb2 import TaskExecution
from tests.contract_support import write_kubeconfig
from tests.servers.k8s_server import K8sTestServer
from tests.test_connector_fleet import wait_meta

from flytekitplugins_ddlscale import BackendUnavailableError, ClusterRef
from flytekitplugins_ddlscale.backends.kubernetes._informer import running_informers
from flytekitplugins_ddlscale.connector import POLL_BACKENDS, ScalingConnector, ScalingMetadata
from flytekitplugins_ddlscale.tasks import WAIT_TASK_TYPE
from flytekitplugins_ddlscale._services.opening import BackendPool

POLLS = 40


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.delenv("DDLSCALE_BACKEND", raising=False)
    with K8sTestServer() as server:
        server.add_cluster("ray", "r1", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 4})
        # r2 desires 3 workers whose pods never become Ready: a wait for them stays RUNNING.
        server.set_ready_delay(3600.0)
        server.add_cluster("ray", "r2", replicas=3, autoscaling={"minReplicas": 1, "maxReplicas": 4}, wait_ready=False)
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server.url)))
        yield server
        for informer in running_informers(None):
            informer.stop()


def test_forty_polls_of_an_execution_use_one_api_client_and_one_connection_each(server, monkeypatch):
    connector = ScalingConnector(WAIT_TASK_TYPE)
    encoded = wait_meta("ray/r2", "kubernetes", 3).encode()  # never reached: every poll answers RUNNING
    opened = server.connections_accepted
    assert asyncio.run(connector.get(ScalingMetadata.decode(encoded))).phase == TaskExecution.RUNNING
    server.wait_for(
        lambda: len(running_informers(None)) == 2 and all(i.synced.is_set() for i in running_informers(None)),
        10, "the shared caches to sync",
    )
    for _ in range(POLLS - 1):
        assert asyncio.run(connector.get(ScalingMetadata.decode(encoded))).phase == TaskExecution.RUNNING
    cluster_reads = [r for r in server.requests if r.method == "GET" and "/rayclusters/" in r.path]
    # At most the first poll reads the server (before the shared cache of cluster objects has listed them).
    assert len(cluster_reads) <= 1
    # The kept backend's connection, plus the shared informers' own clients (pods, cluster objects).
    assert server.connections_accepted - opened <= 3
    assert len(POLL_BACKENDS) == 1
    # Another environment (here: an owner for new claims) configures another backend.
    monkeypatch.setenv("DDLSCALE_OWNER", "someone-else")
    asyncio.run(connector.get(ScalingMetadata.decode(encoded)))
    assert len(POLL_BACKENDS) == 2
    POLL_BACKENDS.close()
    assert len(POLL_BACKENDS) == 0


def _poll_once(pool: BackendPool):
    with pool.backend("kubernetes") as backend:
        backend.get_state(ClusterRef("ray", "r1"))
        return backend


def test_the_least_recently_used_idle_backend_is_closed_when_the_pool_is_full(server, monkeypatch):
    pool = BackendPool(size=2)
    monkeypatch.setenv("DDLSCALE_OWNER", "a")
    first = _poll_once(pool)
    assert _poll_once(pool) is first
    open_before = server.open_connections
    for owner in ("b", "c"):
        monkeypatch.setenv("DDLSCALE_OWNER", owner)
        assert _poll_once(pool) is not first
    assert len(pool) == 2
    # The evicted backend closed its connection to the API server.
    deadline = time.monotonic() + 10
    while server.open_connections >= open_before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.open_connections < open_before + 2
    monkeypatch.setenv("DDLSCALE_OWNER", "a")
    assert _poll_once(pool) is not first
    pool.close()


def test_a_backend_in_use_is_never_closed_to_make_room(server, monkeypatch):
    pool = BackendPool(size=1)
    monkeypatch.setenv("DDLSCALE_OWNER", "a")
    with pool.backend("kubernetes") as held:
        for owner in ("b", "c"):
            monkeypatch.setenv("DDLSCALE_OWNER", owner)
            _poll_once(pool)
        monkeypatch.setenv("DDLSCALE_OWNER", "a")
        # The idle newcomers made way; the one in use stayed open and usable.
        assert len(pool) == 1
        assert held.get_state(ClusterRef("ray", "r1")).ready_workers == 1
    assert _poll_once(pool) is held
    pool.close()
    assert len(pool) == 0


def test_a_kept_backend_whose_kubeconfig_is_missing_fails_the_poll_then_loads_it_once_it_exists(
    server, monkeypatch, tmp_path
):
    pool = BackendPool()
    later = tmp_path / "later" / "kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(later))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(BackendUnavailableError, match="could not load Kubernetes configuration"):
        _poll_once(pool)
    later.parent.mkdir()
    write_kubeconfig(later, server.url)
    assert _poll_once(pool) is _poll_once(pool)
    assert len(pool) == 1
    pool.close()


def test_concurrent_server_reads_reuse_their_connections(server, monkeypatch):
    """Forty threads reading at once through one kept backend (no shared cache: every read is a request)
    open at most one connection each; a pool smaller than the threads would close and reopen them."""
    pool = BackendPool()
    threads, reads = 40, 10
    with pool.backend("kubernetes") as backend:
        opened = server.connections_accepted

        def read(_):
            for _ in range(reads):
                backend.get_state(ClusterRef("ray", "r1"))

        with ThreadPoolExecutor(threads) as workers:
            list(workers.map(read, range(threads)))
    gets = [r for r in server.requests if r.method == "GET" and "/rayclusters/r1" in r.path]
    assert len(gets) >= threads * reads
    assert server.connections_accepted - opened <= threads
    pool.close()
