"""Cluster objects from the shared cache: a steady-state read sends nothing, a cache behind this process's
own patch is not trusted, a 410 re-lists (forgetting the versions noted of objects it no longer lists), a
deleted cluster is read from the server and reported missing.

Against the Kubernetes test server (real HTTP, watches, 410 Gone, held-back watch events as a lagging
watch cache shows them); its request log counts what each read sent.
"""
import dataclasses
import time

import pytest
from tests.servers.k8s_fixtures import backend, k8s, tiers_file  # noqa: F401 - fixtures

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION
from flytekitplugins_ddlscale.backends.kubernetes._informer import Resource, running_informers
from flytekitplugins_ddlscale.errors import ClusterNotFoundError
from flytekitplugins_ddlscale.backends._base import SharedReads

RAY = Resource("rayclusters", CRD_GROUP, CRD_VERSION)
NAMESPACE = "domino-compute"
SHARED = SharedReads(linger=60.0)


def both_synced():
    informers = running_informers(None)
    return len(informers) == 2 and all(i.synced.is_set() for i in informers)


def cluster_reads(server, name=""):
    return sum(1 for r in server.requests if r.method == "GET" and f"/rayclusters/{name}" in r.path
               and r.query.get("watch") != "true")


@pytest.fixture
def warm(k8s, backend):  # noqa: F811
    """A Ray cluster ``r`` of one worker read once with shared reads, both caches synced; stopped after."""
    k8s.add_cluster("ray", "r", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 4})
    ref = ClusterRef("ray", "r")
    backend.get_state(ref, SHARED)
    k8s.wait_for(both_synced, 10, "the pod and cluster-object caches to sync")
    yield ref
    for informer in running_informers(None):
        informer.stop()
    k8s.wait_for(lambda: not running_informers(None) and k8s.open_watches == 0, 10, "the informers to stop")


def test_a_steady_state_read_sends_no_request(k8s, backend, warm):  # noqa: F811
    k8s.clear_log()
    states = [backend.get_state(warm, SHARED) for _ in range(20)]
    # Nothing but the informers' own watches (one may open just after its list): no read at all.
    assert [r for r in k8s.requests if r.query.get("watch") != "true"] == []
    assert {(s.desired_workers, s.ready_workers) for s in states} == {(1, 1)}
    assert k8s.peak_watches_per_resource == 1


def test_a_cached_read_answers_from_running_caches_alone_and_starts_none(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "r", replicas=1)
    ref = ClusterRef("ray", "r")
    backend.get_state(ref)  # the caller's own read: the API client opened, nothing shared
    k8s.clear_log()
    assert backend.cached_state(ref, SHARED) is None
    assert running_informers(None) == [] and k8s.requests == []
    backend.get_state(ref, SHARED)
    k8s.wait_for(both_synced, 10, "the pod and cluster-object caches to sync")
    k8s.clear_log()
    state = backend.cached_state(ref, SHARED)
    assert state is not None and (state.desired_workers, state.ready_workers) == (1, 1)
    assert [r for r in k8s.requests if r.query.get("watch") != "true"] == []
    for informer in running_informers(None):
        informer.stop()


def test_a_cache_behind_our_own_patch_is_not_trusted(k8s, backend, warm):  # noqa: F811
    (objects,) = running_informers(RAY)
    k8s.hold_events("rayclusters")
    backend.scale(warm, 3, wait=False)
    k8s.clear_log()
    # The cache still holds the object from before the patch (1 worker): the read goes to the server.
    assert objects.fresh("r") is None
    assert backend.get_state(warm, SHARED).desired_workers == 3
    assert cluster_reads(k8s, "r") == 1
    k8s.release_events("rayclusters")
    k8s.wait_for(lambda: objects.fresh("r") is not None, 10, "the cache to catch up with the patch")
    k8s.clear_log()
    assert backend.get_state(warm, SHARED).desired_workers == 3
    assert cluster_reads(k8s) == 0


def test_a_version_another_process_wrote_holds_the_cache_back_only_until_the_watch_brings_it(
    k8s, backend, warm  # noqa: F811
):
    """Another connector replica's write, whose version a node's metadata carries: every poll states it
    (``expect_version``); reads go to the server until the cache holds it, then send nothing again."""
    from kubernetes import client

    (objects,) = running_informers(RAY)
    k8s.hold_events("rayclusters")
    other = k8s.api_client()
    try:
        written = client.CustomObjectsApi(other).patch_namespaced_custom_object(
            CRD_GROUP, CRD_VERSION, NAMESPACE, "rayclusters", "r",
            {"spec": {"worker": {"replicas": 2}, "autoscaling": {"minReplicas": 2}}},
            _content_type="application/merge-patch+json",
        )
    finally:
        other.close()
    version = written["metadata"]["resourceVersion"]
    k8s.clear_log()
    backend.expect_version(warm, version)
    assert backend.get_state(warm, SHARED).desired_workers == 2
    assert cluster_reads(k8s, "r") == 1
    k8s.release_events("rayclusters")
    k8s.wait_for(lambda: objects.fresh("r") is not None, 10, "the cache to catch up with the other write")
    k8s.clear_log()
    for _ in range(5):
        backend.expect_version(warm, version)
        assert backend.get_state(warm, SHARED).desired_workers == 2
    assert cluster_reads(k8s) == 0


def test_a_410_relists_the_cluster_objects(k8s, backend, warm):  # noqa: F811
    (objects,) = running_informers(RAY)
    k8s.hold_events("rayclusters")
    # Written by another client: nothing in this process notes its version, only the re-list brings it.
    other = k8s.api_client()
    try:
        from kubernetes import client

        client.CustomObjectsApi(other).patch_namespaced_custom_object(
            CRD_GROUP, CRD_VERSION, NAMESPACE, "rayclusters", "r",
            {"spec": {"worker": {"replicas": 2}, "autoscaling": {"minReplicas": 2}}},
            _content_type="application/merge-patch+json",
        )
    finally:
        other.close()
    # History forgotten first, then the held watch cut: it comes back from a version the server no longer has.
    k8s.compact()
    k8s.drop_watches()
    k8s.release_events("rayclusters")
    k8s.wait_for(lambda: objects.lists == 2, 10, "the re-list after 410 Gone")
    k8s.clear_log()
    assert backend.get_state(warm, SHARED).desired_workers == 2
    assert cluster_reads(k8s) == 0


def test_a_relist_forgets_the_versions_noted_of_clusters_it_no_longer_lists(k8s, backend, warm):  # noqa: F811
    k8s.add_cluster("ray", "g", replicas=1)
    (objects,) = running_informers(RAY)
    k8s.wait_for(lambda: objects.fresh("g") is not None, 10, "the cache to hold g")
    k8s.hold_events("rayclusters")
    backend.scale(ClusterRef("ray", "g"), 2, wait=False)
    # Our own patch, which the held watch has not brought: the cache must not answer for g.
    assert objects.fresh("g") is None and set(objects._floors) == {"g"}
    # g goes while no watch tells (deleted by another client), and the history with it: only the re-list knows.
    k8s.commit("rayclusters", NAMESPACE, None, "g", "DELETED")
    k8s.compact()
    k8s.drop_watches()
    k8s.release_events("rayclusters")
    k8s.wait_for(lambda: objects.lists == 2, 10, "the re-list after 410 Gone")
    assert objects._floors == {}
    k8s.clear_log()
    assert backend.get_state(warm, SHARED).desired_workers == 1
    assert cluster_reads(k8s) == 0


def test_a_deleted_cluster_is_read_from_the_server_and_reported_missing(k8s, backend, warm):  # noqa: F811
    (objects,) = running_informers(RAY)
    k8s.commit("rayclusters", NAMESPACE, None, "r", "DELETED")
    k8s.wait_for(lambda: objects.fresh("r") is None, 10, "the watch to report the deletion")
    k8s.clear_log()
    with pytest.raises(ClusterNotFoundError, match="not found"):
        backend.get_state(warm, SHARED)
    assert cluster_reads(k8s, "r") == 1


def test_a_wait_is_woken_by_its_cluster_s_deletion_and_ends_not_found(k8s, backend, warm):  # noqa: F811
    """No pod changes after the deletion (the pods never become Ready): only the cluster object's event can
    end the wait before its next periodic re-read of the object (MAX_WINDOW) or its deadline."""
    import threading

    from flytekitplugins_ddlscale.backends.kubernetes._podwatch import MAX_WINDOW

    k8s.set_ready_delay(3600.0)
    (objects,) = running_informers(RAY)
    named = lambda: any(objects._named.values())  # noqa: E731 - the wait's hold on its cluster object
    deleted = threading.Thread(target=lambda: (
        k8s.wait_for(named, 30, "the wait to hold its cluster object"),
        k8s.commit("rayclusters", NAMESPACE, None, "r", "DELETED"),
    ))
    deleted.start()
    began = time.monotonic()
    try:
        with pytest.raises(ClusterNotFoundError, match="not found"):
            backend.scale(warm, 3, wait=True, timeout=3 * MAX_WINDOW)
    finally:
        deleted.join()
    # Not a figure: a wait that missed the event would have gone on to its periodic re-read, MAX_WINDOW
    # seconds after its start (where a read of the server finds the cluster gone too).
    assert time.monotonic() - began < MAX_WINDOW
    assert not objects._named, "the wait's hold on its cluster object outlived it"


def test_a_role_without_list_on_the_cluster_objects_reads_them_from_the_server(k8s, backend):  # noqa: F811
    k8s.add_cluster("ray", "r", replicas=1)
    k8s.forbid("list", "rayclusters")
    ref = ClusterRef("ray", "r")
    assert backend.get_state(ref, SHARED).ready_workers == 1
    k8s.wait_for(lambda: not running_informers(RAY), 10, "the refused informer to stop")
    states = [backend.get_state(ref, SHARED) for _ in range(5)]
    assert {s.ready_workers for s in states} == {1}
    lists = [r for r in k8s.requests if r.method == "GET" and r.path.endswith("/rayclusters")]
    assert len(lists) == 1  # refused once; not tried again on every read
    assert cluster_reads(k8s, "r") >= 6
    for informer in running_informers(None):
        informer.stop()


@pytest.mark.parametrize("kind", ["ray", "spark", "dask", "mpi", "kuberay", "dask-operator"])
def test_trimmed_copies_give_the_same_state_as_the_objects(k8s, backend, kind):  # noqa: F811
    """The cache keeps only what a state is built from: every kind's state from trimmed copies is the same."""
    from flytekitplugins_ddlscale.backends.kubernetes._informer import PODS, trim

    if kind == "kuberay":
        k8s.add_kuberay("t")
    elif kind == "dask-operator":
        k8s.add_dask_operator("t")
    else:
        k8s.add_cluster(kind, "t", replicas=2, autoscaling={"minReplicas": 1, "maxReplicas": 4}
                        if kind != "mpi" else None, worker_tier="small-k8s", head_tier="small-k8s")
    ref = ClusterRef(kind, "t")
    obj, pods = backend._read(ref), backend._pods(ref)
    resource = backend._resource(ref)
    trimmed = trim(resource, obj)
    seen = [dataclasses.replace(backend._state(ref, o, ps), observed_at=None)
            for o, ps in ((obj, pods), (trimmed, [trim(PODS, p) for p in pods]))]
    assert seen[0] == seen[1]
    assert len(repr(trimmed)) < len(repr(obj)) and sum(len(repr(trim(PODS, p))) for p in pods) < len(repr(pods))
