"""The shared pod informer: one list+watch per namespace for every wait, under churn, with nothing left behind.

Against the Kubernetes test server (real HTTP, watches, 410 Gone); the
server counts open watch connections and requests, the process's threads are
counted before and after.
"""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.servers.k8s_fixtures import backend, k8s, make_backend, tiers_file  # noqa: F401 - fixtures

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.backends.kubernetes._informer import matches, parse_selector, running_informers
from flytekitplugins_ddlscale.errors import InvalidInputError, ScalingTimeoutError
from flytekitplugins_ddlscale.backends._base import SharedReads


def informer_threads():
    return [t for t in threading.enumerate() if t.name.startswith("ddlscale-informer")]


def pod_lists(server):
    return sum(1 for r in server.requests if r.path.endswith("/pods") and r.method == "GET" and r.query.get("watch") != "true")


def namespace_lists(server):
    """Lists of every pod of the namespace (the informer's), as opposed to one cluster's pods."""
    return sum(
        1 for r in server.requests
        if r.path.endswith("/pods") and r.method == "GET" and r.query.get("watch") != "true"
        and not r.query.get("labelSelector")
    )


def watch_requests(server):
    return sum(1 for r in server.requests if r.query.get("watch") == "true")


def assert_nothing_left(server, timeout=10.0):
    server.wait_for(lambda: not informer_threads() and not running_informers(None), timeout, "the informers to stop")
    server.wait_for(lambda: server.open_watches == 0, timeout, "the server to see no open watch")


def test_selectors_parse_and_match():
    reqs = parse_selector("app=ray, tier!=gpu,component,!deleting")
    assert reqs == [("app", "=", "ray"), ("tier", "!=", "gpu"), ("component", "exists", None), ("deleting", "!", None)]
    assert matches(reqs, {"app": "ray", "component": "worker"})
    assert not matches(reqs, {"app": "ray", "component": "worker", "tier": "gpu"})
    assert not matches(reqs, {"app": "ray"})
    assert not matches(reqs, {"app": "ray", "component": "worker", "deleting": "yes"})
    assert matches(parse_selector("a==b"), {"a": "b"})
    with pytest.raises(InvalidInputError, match="selector"):
        parse_selector("app in ray")


def test_set_based_selectors_match_as_the_api_server_reads_them():
    # KubeRay waits select one worker group and the head group: ray.io/group in (headgroup,gpu).
    reqs = parse_selector("ray.io/cluster=r1,ray.io/group in (headgroup, gpu),zone notin (a,b)")
    assert reqs == [("ray.io/cluster", "=", "r1"), ("ray.io/group", "in", frozenset({"headgroup", "gpu"})),
                    ("zone", "notin", frozenset({"a", "b"}))]
    assert matches(reqs, {"ray.io/cluster": "r1", "ray.io/group": "gpu"})
    assert matches(reqs, {"ray.io/cluster": "r1", "ray.io/group": "headgroup", "zone": "c"})
    assert not matches(reqs, {"ray.io/cluster": "r1", "ray.io/group": "cpu"})
    assert not matches(reqs, {"ray.io/cluster": "r1"})
    assert not matches(reqs, {"ray.io/cluster": "r1", "ray.io/group": "gpu", "zone": "a"})


def test_concurrent_waits_share_one_watch_and_one_list(k8s, backend):  # noqa: F811
    names = [f"c{i}" for i in range(12)]
    for name in names:
        k8s.add_cluster("ray", name, replicas=1)
    k8s.add_cluster("dask", "other", replicas=1)  # pods of another kind in the same namespace
    k8s.set_ready_delay(0.8)
    threads_before = set(threading.enumerate())
    k8s.clear_log()
    with ThreadPoolExecutor(len(names)) as pool:
        results = list(pool.map(lambda n: backend.scale(ClusterRef("ray", n), 3, timeout=30), names))
    assert [r.final.ready_workers for r in results] == [3] * len(names)
    # One watch per resource read: the pods, and the cluster objects the waits' state reads come from.
    assert k8s.peak_watches_per_resource == 1 and k8s.peak_watches <= 2
    # Each scale reads its cluster's pods once before patching; the waits add ONE list (the informer's).
    assert namespace_lists(k8s) == 1
    assert pod_lists(k8s) <= len(names) + 1  # a scale that starts after the cache is synced reads it instead
    assert_nothing_left(k8s)
    # The server keeps a handler thread per pooled keep-alive connection; the client leaves none of its own.
    assert not [t for t in set(threading.enumerate()) - threads_before if "process_request" not in t.name]


def test_waits_starting_and_ending_while_the_watch_restarts(k8s, backend):  # noqa: F811
    """Churn: waits come and go in waves while the shared watch is cut and its history expires (410)."""
    names = [f"w{i}" for i in range(10)]
    for name in names:
        k8s.add_cluster("dask", name, replicas=1)
    k8s.set_ready_delay(1.0)
    stop = threading.Event()
    cuts = []

    def saboteur():
        while not stop.is_set():
            if k8s.open_watches:
                k8s.drop_watches()
                k8s.compact()
                cuts.append(time.monotonic())
            stop.wait(0.4)

    breaker = threading.Thread(target=saboteur)
    breaker.start()
    outcomes = {}

    def one(index):
        name = names[index]
        time.sleep(0.15 * index)  # staggered: waits start while others are mid-way or ending
        ref = ClusterRef("dask", name)
        if index % 3 == 0:
            # Short timeouts: these waits end (time out) while the others go on.
            with pytest.raises(ScalingTimeoutError) as caught:
                backend.scale(ref, 3, timeout=0.4)
            outcomes[name] = ("timeout", caught.value.state)
            backend.wait_for_workers(ref, 3, timeout=30)
            return
        outcomes[name] = ("done", backend.scale(ref, 3, timeout=30).final)

    try:
        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(one, range(len(names))))
    finally:
        stop.set()
        breaker.join()
    assert len(cuts) >= 2, "the watch was never cut"
    for name, (how, state) in outcomes.items():
        assert state is not None
        if how == "done":
            assert state.ready_workers == 3, name
        assert k8s.ready_workers(name, kind="dask") == 3
    assert_nothing_left(k8s)


def test_410_relists_once_for_all_waiters(k8s, backend):  # noqa: F811
    names = [f"g{i}" for i in range(8)]
    for name in names:
        k8s.add_cluster("ray", name, replicas=1)
    k8s.set_ready_delay(60)
    for name in names:
        backend.scale(ClusterRef("ray", name), 2, wait=False)
    k8s.clear_log()
    errors = []

    def wait(name):
        try:
            backend.wait_for_workers(ClusterRef("ray", name), 2, timeout=3)
        except ScalingTimeoutError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wait, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    k8s.wait_for(lambda: k8s.open_watches_of("pods") == 1 and running_informers()[0].subscribers == len(names), 10,
                 "every wait to subscribe")
    (informer,) = running_informers()
    lists_before = pod_lists(k8s)
    k8s.drop_watches()
    k8s.compact()
    k8s.wait_for(lambda: informer.lists == 2, 10, "the re-list")
    for thread in threads:
        thread.join(15)
    assert len(errors) == len(names)
    assert all(e.state is not None and e.state.ready_workers == 1 for e in errors)
    assert pod_lists(k8s) - lists_before == 1
    assert k8s.peak_watches_per_resource <= 1
    assert_nothing_left(k8s)


def test_a_cancelled_wait_leaves_the_others_waiting(k8s, backend):  # noqa: F811
    for name in ("a", "b"):
        k8s.add_cluster("ray", name, replicas=1)
    k8s.set_ready_delay(1.0)

    class Cancelled(Exception):
        pass

    def cancel(progress):
        raise Cancelled()

    result = {}
    other = threading.Thread(target=lambda: result.update(b=backend.scale(ClusterRef("ray", "b"), 3, timeout=30)))
    other.start()
    k8s.wait_for(lambda: k8s.open_watches_of("pods") == 1, 10, "the shared watch")
    with pytest.raises(Cancelled):
        backend.scale(ClusterRef("ray", "a"), 3, timeout=30, progress=cancel)
    assert k8s.open_watches_of("pods") == 1 and running_informers()[0].subscribers == 1
    other.join(30)
    assert result["b"].final.ready_workers == 3
    assert_nothing_left(k8s)


def test_forbidden_watch_ends_every_wait_and_the_next_wait_starts_afresh(k8s, backend):  # noqa: F811
    from flytekitplugins_ddlscale.errors import UnauthorizedError

    k8s.add_cluster("ray", "f", replicas=1)
    k8s.set_ready_delay(0.3)
    k8s.forbid("watch", "pods")
    with pytest.raises(UnauthorizedError, match="refused to watch pods"):
        backend.scale(ClusterRef("ray", "f"), 2, timeout=10)
    assert_nothing_left(k8s)
    k8s.allow_all()
    assert backend.wait_for_workers(ClusterRef("ray", "f"), 2, timeout=10).ready_workers == 2
    assert_nothing_left(k8s)


def test_stopping_the_informer_is_not_taken_for_a_broken_connection(k8s, backend):  # noqa: F811
    """A watch this process shut down is no cut stream: a 403 after it is not ridden out as a restarted server's."""
    k8s.add_cluster("ray", "s", replicas=1)
    k8s.set_ready_delay(0.3)
    assert backend.scale(ClusterRef("ray", "s"), 2, timeout=30).final.ready_workers == 2
    # The informer lingers after its last wait, its watch still open: stop it the way interpreter exit does.
    k8s.wait_for(lambda: k8s.open_watches_of("pods") == 1, 10, "the lingering watch")
    informer = running_informers()[0]
    informer.stop()
    informer.join(10)
    assert not informer.api.outage.unsettled()
    assert_nothing_left(k8s)


def test_shared_reads_serve_concurrent_status_reads_from_one_watch(k8s, tiers_file):  # noqa: F811
    names = [f"s{i}" for i in range(10)]
    for name in names:
        k8s.add_cluster("spark", name, replicas=2)
    k8s.clear_log()
    with make_backend(k8s, tiers_file) as one:

        def status(name):
            # A linger beyond the reads' spread, within the 10 s the end waits for the close: on a loaded
            # machine a 1 s gap between two threads' reads ended the watch and counted a second list.
            return one.get_state(ClusterRef("spark", name), SharedReads(linger=5.0))

        with ThreadPoolExecutor(len(names)) as pool:
            states = list(pool.map(status, names * 3))
    assert [s.ready_workers for s in states] == [2] * len(states)
    assert pod_lists(k8s) == 1 and watch_requests(k8s) >= 1 and k8s.peak_watches_per_resource == 1
    # Kept for the linger time (one timer per informer, however many reads extended it), then closed.
    assert running_informers()
    assert len([t for t in threading.enumerate() if isinstance(t, threading.Timer)]) <= len(running_informers(None)) <= 2
    assert_nothing_left(k8s)


def test_a_rotated_service_account_token_keeps_its_informers(tmp_path, monkeypatch):
    """In a pod the client reads its token file before each request; the kubelet replaces the file hourly. The
    shared informers are keyed by that file, so a rotation keeps them, and an informer's own client (a copy)
    sends the token the file holds now. A token given as a value (a kubeconfig's) is its own identity."""
    from kubernetes import client
    from kubernetes.config import incluster_config

    from flytekitplugins_ddlscale.backends.kubernetes._api import KubeApi, PODS, make_api_client
    from flytekitplugins_ddlscale.backends.kubernetes._informer import _key, _own_api

    def in_cluster(token_file):
        monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token_file))
        return KubeApi(make_api_client(None, None, True))

    def bearer(api):
        return api.api_client.configuration.get_api_key_with_prefix("BearerToken")

    (tmp_path / "ca.crt").write_text("ca")
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    token, other = tmp_path / "token", tmp_path / "other-token"
    token.write_text("first")
    other.write_text("first")
    api = in_cluster(token)
    assert bearer(api) == "Bearer first"
    before, informers_client = _key(api, "ns", PODS), _own_api(api)
    token.write_text("second-and-longer")  # the kubelet's rotation
    assert bearer(api) == "Bearer second-and-longer"
    assert _key(api, "ns", PODS) == before
    assert bearer(informers_client) == "Bearer second-and-longer"
    assert _key(in_cluster(other), "ns", PODS) != before

    def given(value):
        configuration = client.Configuration(host="https://10.0.0.1:443", api_key={"BearerToken": value})
        return KubeApi(client.ApiClient(configuration))

    assert _key(given("Bearer first"), "ns", PODS) != _key(given("Bearer second"), "ns", PODS)
