"""One timeout contract on every backend, waits that can never end, and restore bookkeeping.

The scaler service and Kubernetes run as the protocol-true test servers;
local clusters are real Dask processes. The remedy command an error prints
is run exactly as printed, in bash, and must really restore the cluster.
"""
import contextlib
import datetime
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest

from flytekitplugins_ddlscale import ClusterRef, InvalidInputError, ScalingTimeoutError, WorkerFailedError
from flytekitplugins_ddlscale.errors import UnreachableWaitError, UnsupportedOperationError
from flytekitplugins_ddlscale.models import ReplicaSpec
from flytekitplugins_ddlscale.refs import KINDS
from flytekitplugins_ddlscale._core.waiting import Backoff
from tests.contract_support import kill_once_marked, run_shell, shell_environment, stop_outside_locks, write_kubeconfig
from tests.pause_support import Pause, kill_once_paused
from tests.servers.k8s_server import K8sTestServer
from tests.servers.scaler_server import DEFAULT_API_KEY, ScalerTestServer
from tests.test_local_support import local_state  # noqa: F401 - fixture

FAST = Backoff(initial=0.02, factor=1.5, cap=0.1)
AUTO = {"minReplicas": 1, "maxReplicas": 6}


@dataclass
class World:
    """One backend on one cluster of 1 worker (at most 6), and how to look at it from outside the backend."""

    backend: object
    ref: ClusterRef
    setting: str
    """What holds the size, as errors name it."""
    maximum: str
    """What bounds the size, as errors name it."""
    prefix: str
    """The environment a remedy command must carry (state directory, service URL, kubeconfig)."""
    options: str
    """The ``get_backend`` keywords a remedy call must carry."""
    desired: Callable[[], int]
    """The desired worker count, read from the server or the state directory."""
    slow: Callable[[], None] = lambda: None
    """Make new workers take longer to come than :attr:`short_timeout`."""
    short_timeout: float = 0.3
    """A timeout the change's own requests fit in and its slowed workers miss (the timed-out tests)."""
    break_workers: Optional[Callable[[], None]] = None
    """Make every new worker fail to start."""
    shell_env: Dict[str, str] = field(default_factory=dict)
    """What a user has exported anyway (credentials): never part of a printed command."""

    def command(self, verb: str, *extra: str) -> str:
        namespace = f" --namespace {self.ref.namespace}" if self.ref.namespace else ""
        tail = "".join(f" {word}" for word in extra)
        return (
            f"{self.prefix}ddlscale {verb} --backend {self.backend.name} --kind {self.ref.kind} "
            f"--name {self.ref.name}{namespace}{tail}"
        )

    def call(self, method: str, *args: int) -> str:
        parts = [self.ref.kind, self.ref.name] + ([self.ref.namespace] if self.ref.namespace else [])
        ref = ", ".join(f'"{p}"' for p in parts)
        rest = "".join(f", {a}" for a in args)
        return f'get_backend("{self.backend.name}"{self.options}).{method}(ClusterRef({ref}){rest})'


def observed(state) -> int:
    return state.ready_workers if state.ready_workers is not None else state.existing_workers


@contextlib.contextmanager
def scaler_world(tmp_path: Path) -> Iterator[World]:
    with ScalerTestServer() as server:
        server.add_cluster("ray", "ray-contract", replicas=1, max_replicas=6, min_replicas=1)
        from flytekitplugins_ddlscale.backends.scaler import ScalerOptions, ScalerServiceBackend

        state = tmp_path / "scaler-state"
        backend = ScalerServiceBackend(
            server.url, api_key=DEFAULT_API_KEY, state_dir=state, env={},
            options=ScalerOptions(timeout=5.0, retry_backoff=FAST, poll_backoff=FAST),
        )
        try:
            yield World(
                backend, ClusterRef("ray", "ray-contract"), "spec.worker.replicas", "maxReplicas",
                prefix=f"CLUSTER_SCALER_BASE_URL={server.url} DDLSCALE_STATE_DIR={state} ",
                options=f', base_url="{server.url}", state_dir="{state}"',
                desired=lambda: server.cluster_object("ray", "ray-contract")["spec"]["worker"]["replicas"],
                slow=lambda: server.set_pod_ready_delay(1.0),
                shell_env={"DOMINO_API_KEY": DEFAULT_API_KEY},
            )
        finally:
            backend.close()


@contextlib.contextmanager
def kubernetes_world(tmp_path: Path) -> Iterator[World]:
    with K8sTestServer(ready_delay=0.02) as server:
        server.add_cluster("ray", "ray-contract", replicas=1, autoscaling=AUTO)
        from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

        config = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        backend = KubernetesBackend(kubeconfig=str(config), failure_grace=0.3)
        try:
            yield World(
                backend, ClusterRef("ray", "ray-contract", "domino-compute"), "spec.worker.replicas", "maxReplicas",
                prefix=f"KUBECONFIG={config} ",
                options=f', kubeconfig="{config}"',
                desired=lambda: server.get_object("ray", "ray-contract")["spec"]["worker"]["replicas"],
                slow=lambda: server.set_ready_delay(1.0),
                break_workers=lambda: server.inject_fault("ray-contract", "CrashLoopBackOff", ordinals=[2]),
            )
        finally:
            backend.close()


@contextlib.contextmanager
def real_kubernetes_world(tmp_path: Path, envtest) -> Iterator[World]:
    """The kubernetes world on the envtest tier's real kube-apiserver (admin kubeconfig, a namespace of its own)."""
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
    from tests.envtest.sides import RealServerSide

    side = RealServerSide(tmp_path / "no-tiers.yaml", envtest)
    try:
        side.add_cluster("ray", "ray-contract", replicas=1, autoscaling=AUTO)
        config = envtest.plane.admin_kubeconfig
        backend = KubernetesBackend(kubeconfig=str(config), failure_grace=0.3)
        try:
            yield World(
                backend, ClusterRef("ray", "ray-contract", side.namespace), "spec.worker.replicas", "maxReplicas",
                prefix=f"KUBECONFIG={config} ",
                options=f', kubeconfig="{config}"',
                desired=lambda: side.get_object("ray", "ray-contract")["spec"]["worker"]["replicas"],
                # A real API server under load may take longer than 0.3 s to accept the change itself.
                slow=lambda: side.set_ready_delay(5.0), short_timeout=2.0,
            )
        finally:
            backend.close()
    finally:
        side.close()


@contextlib.contextmanager
def operator_world(tmp_path: Path, kind: str) -> Iterator[World]:
    """A KubeRay or Dask-operator cluster on the Kubernetes test server."""
    with K8sTestServer(ready_delay=0.02) as server:
        from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

        name = f"{kind}-contract"
        if kind == "kuberay":
            server.add_kuberay(name, groups=[{"groupName": "workers", "replicas": 1, "minReplicas": 1,
                                              "maxReplicas": 6}], autoscaling=True)
            setting, maximum = "spec.workerGroupSpecs[0].replicas", "maxReplicas"

            def desired() -> int:
                obj = server.get_resource("rayclusters.ray.io", name)
                return obj["spec"]["workerGroupSpecs"][0]["replicas"]
        else:
            server.add_dask_operator(name, replicas=1)
            setting, maximum = "spec.worker.replicas", ""

            def desired() -> int:
                return server.get_resource("daskworkergroups.kubernetes.dask.org", f"{name}-default")["spec"]["worker"]["replicas"]

        config = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        backend = KubernetesBackend(kubeconfig=str(config), failure_grace=0.3)
        try:
            yield World(
                backend, ClusterRef(kind, name, "domino-compute"), setting, maximum,
                prefix=f"KUBECONFIG={config} ",
                options=f', kubeconfig="{config}"',
                desired=desired,
                slow=lambda: server.set_ready_delay(1.0),
                break_workers=lambda: server.inject_fault(name, "CrashLoopBackOff", new_only=True),
            )
        finally:
            backend.close()


SLOW_PRELOAD = Path(__file__).with_name("slow_worker_preload.py")


@contextlib.contextmanager
def local_world(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    from flytekitplugins_ddlscale.backends.local import LocalBackend

    state = root / "local"
    backend = LocalBackend(state_dir=state, max_workers=6)
    ref = ClusterRef("dask", "dask-contract")
    try:
        backend.up(ref, 1, timeout=60)
        yield World(
            backend, ref, "desired_workers", "max_workers",
            prefix=f"DDLSCALE_STATE_DIR={root} ",
            options=f', state_dir="{state}"',
            desired=lambda: backend.store.load(ref).desired,
            # A bad Dask setting in the environment makes every new worker process exit during start-up.
            break_workers=lambda: monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL", "bogus"),
            # A preload holds every new worker back before it registers (tests/slow_worker_preload.py).
            slow=lambda: monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PRELOAD", repr([str(SLOW_PRELOAD)])),
        )
    finally:
        monkeypatch.delenv("DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL", raising=False)
        monkeypatch.delenv("DASK_DISTRIBUTED__WORKER__PRELOAD", raising=False)
        backend.shutdown_all()


@contextlib.contextmanager
def example_world(tmp_path: Path) -> Iterator[World]:
    """tests/example_backend.py, written from docs/backends.md: a backend not shipped passes the same contract,
    its printed commands run by a ``ddlscale`` that finds it through its entry point."""
    from tests.example_backend import ExampleBackend, registered

    root = tmp_path / "example-state"
    backend = ExampleBackend(state_dir=root / "example")
    ref = ClusterRef("dask", "dask-contract")
    backend.create(ref, 1)
    with backend:
        yield World(
            backend, ref, "desired_workers", "max_workers",
            prefix=f"DDLSCALE_STATE_DIR={root} ",
            options=f', state_dir="{backend.directory}"',
            desired=lambda: backend.desired(ref),
            slow=lambda: backend.set_delay(ref, 1.0),
            shell_env={"PYTHONPATH": registered(tmp_path / "registry")},
        )


BACKENDS = ["scaler", "kubernetes", pytest.param("kubernetes-real", marks=pytest.mark.envtest), "kuberay",
            "dask-operator", pytest.param("local", marks=pytest.mark.slow), "example"]


@pytest.fixture(params=BACKENDS)
def world(request, tmp_path, monkeypatch) -> Iterator[World]:
    """Each backend in turn; this process's own state directory points elsewhere, so commands must name theirs."""
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "elsewhere"))
    for name in ("CLUSTER_SCALER_BASE_URL", "KUBECONFIG", "DOMINO_API_HOST", "DOMINO_API_PROXY"):
        monkeypatch.delenv(name, raising=False)
    if request.param == "scaler":
        made = scaler_world(tmp_path)
    elif request.param == "kubernetes":
        made = kubernetes_world(tmp_path)
    elif request.param == "kubernetes-real":
        made = real_kubernetes_world(tmp_path, request.getfixturevalue("envtest"))
    elif request.param in ("kuberay", "dask-operator"):
        made = operator_world(tmp_path, request.param)
    elif request.param == "example":
        made = example_world(tmp_path)
    else:
        made = local_world(request.getfixturevalue("local_state"), monkeypatch)
    with made as instance:
        yield instance


# ----- part 3: a change whose wait fails stays in place -----


def test_a_timed_out_scale_stays_in_place_and_its_restore_command_restores(world):
    world.slow()
    with pytest.raises(ScalingTimeoutError) as caught:
        world.backend.scale(world.ref, 3, timeout=world.short_timeout)
    error = caught.value
    text = str(error)
    assert error.left_in_place == f"{world.setting}=3"
    assert f"{world.setting}=3 left in place: " in text and " of 3 " in text and "nothing was rolled back" in text
    assert error.remedy_command == world.command("restore")
    assert error.remedy_call == world.call("restore_baseline")
    assert error.remedy_command in text and error.remedy_call in text

    # Nothing was rolled back: the request stays, and the slow workers still come.
    assert world.desired() == 3
    assert world.backend.get_baseline(world.ref).replicas == 1
    assert observed(world.backend.wait_for_workers(world.ref, 3, timeout=60)) == 3

    ran = run_shell(error.remedy_command, **world.shell_env)
    assert ran.returncode == 0, ran.stderr
    assert world.desired() == 1
    state = world.backend.get_state(world.ref)
    assert (state.desired_workers, observed(state)) == (1, 1)
    assert world.backend.get_baseline(world.ref) is None


def test_a_timed_out_restore_stays_in_place_and_its_command_waits_for_it(world):
    world.backend.scale(world.ref, 0, timeout=60)
    world.slow()
    with pytest.raises(ScalingTimeoutError) as caught:
        world.backend.restore_baseline(world.ref, timeout=world.short_timeout)
    error = caught.value
    assert error.left_in_place == f"{world.setting}=1"
    assert f"{world.setting}=1 (the restore) left in place: " in str(error)
    assert "baseline record was cleared" in str(error)
    assert error.remedy_command == world.command("status", "--wait")
    assert error.remedy_call == world.call("wait_for_workers", 1)
    assert world.desired() == 1 and world.backend.get_baseline(world.ref) is None

    ran = run_shell(error.remedy_command, **world.shell_env)
    assert ran.returncode == 0, ran.stderr
    assert "desired=1 existing=1" in ran.stdout
    assert observed(world.backend.get_state(world.ref)) == 1


def test_a_timed_out_reconcile_to_a_claim_stays_in_place_and_names_the_restore(world):
    world.backend.claim(world.ref, "phase-a", 2)
    world.slow()
    with pytest.raises(ScalingTimeoutError) as caught:
        world.backend.reconcile(world.ref, timeout=world.short_timeout)
    error = caught.value
    assert f"{world.setting}=2 left in place: " in str(error)
    assert error.remedy_command == world.command("restore")
    assert world.desired() == 2
    assert set(world.backend.claims(world.ref)) == {"phase-a"} and world.backend.get_baseline(world.ref).replicas == 1


# The scaler service shows no pod failures, so only these two backends can report one.
@pytest.mark.parametrize(
    "world", ["kubernetes", "kuberay", "dask-operator", pytest.param("local", marks=pytest.mark.slow)], indirect=True
)
def test_a_worker_that_cannot_start_leaves_the_request_in_place(world):
    world.break_workers()
    with pytest.raises(WorkerFailedError) as caught:
        world.backend.scale(world.ref, 3, timeout=60)
    error = caught.value
    assert error.left_in_place == f"{world.setting}=3"
    assert f"{world.setting}=3 left in place: " in str(error)
    assert error.remedy_command == world.command("restore")
    assert world.desired() == 3
    assert world.backend.get_baseline(world.ref).replicas == 1

    ran = run_shell(error.remedy_command, **world.shell_env)
    assert ran.returncode == 0, ran.stderr
    state = world.backend.get_state(world.ref)
    assert (state.desired_workers, observed(state), state.existing_workers) == (1, 1, 1)


# ----- part 2: a wait that can never end fails at once -----


def test_a_wait_for_workers_that_can_never_come_fails_at_once(world):
    reports = []
    # A DaskWorkerGroup has no maximum: there only the desired count bounds a wait.
    if world.maximum:
        with pytest.raises(UnreachableWaitError) as caught:
            world.backend.wait_for_workers(world.ref, 7, timeout=120, progress=reports.append)
        error = caught.value
        assert isinstance(error, InvalidInputError) and error.code == "unreachable_wait"
        assert (error.field, error.value, error.desired, error.maximum) == ("replicas", 7, 1, 6)
        assert "replicas=7" in str(error) and f"{world.setting}=1" in str(error) and f"{world.maximum}=6" in str(error)
        assert reports == []  # refused before the wait polled at all

    # Within maxReplicas but above what is desired: it could only time out too.
    with pytest.raises(UnreachableWaitError, match="allowed: 0..1") as above:
        world.backend.wait_for_workers(world.ref, 2, timeout=120, progress=reports.append)
    assert f"{world.setting}=1" in str(above.value)
    assert reports == []
    assert observed(world.backend.wait_for_workers(world.ref, 1, timeout=60)) == 1
    assert world.desired() == 1


def test_check_reachable_names_the_maximum_when_it_is_the_tighter_bound():
    from flytekitplugins_ddlscale.backends._support.inplace import check_reachable

    check_reachable(3, desired=4, maximum=3, cluster="ray/x")
    with pytest.raises(UnreachableWaitError, match=r"spec.worker.replicas=4 desired, maxReplicas=3.*allowed: 0..3"):
        check_reachable(4, desired=4, maximum=3, cluster="ray/x")
    with pytest.raises(UnreachableWaitError, match="no maxReplicas"):
        check_reachable(5, desired=4, maximum=None, cluster="ray/x")


# ----- part 4: one bookkeeping behaviour -----


def test_restore_drops_live_claims_and_says_which(world, caplog):
    world.backend.claim(world.ref, "a", 2)
    assert set(world.backend.claims(world.ref)) == {"a"}
    with caplog.at_level(logging.WARNING, logger="flytekitplugins_ddlscale"):
        world.backend.restore_baseline(world.ref, timeout=60)
    assert world.backend.claims(world.ref) == {}
    assert "restore dropped claims a" in caplog.text
    assert world.backend.get_baseline(world.ref) is None
    assert world.desired() == 1


def test_remedy_text_quotes_settings_and_survives_pickling():
    import pickle

    from flytekitplugins_ddlscale.backends._support.inplace import Reach, left_in_place
    from flytekitplugins_ddlscale.models import ClusterState

    reach = Reach("local", ClusterRef("dask", "d1", "team-a"), env={"DDLSCALE_STATE_DIR": "/tmp/my state"},
                  options={"state_dir": "/tmp/my state/local"})
    state = ClusterState("team-a/dask/d1", "Starting", 3, 2, ready_workers=1)
    error = left_in_place(ScalingTimeoutError("timed out", state=state), reach, "desired_workers", 3, restoring=False)
    assert error.remedy_command == (
        "DDLSCALE_STATE_DIR='/tmp/my state' ddlscale restore --backend local --kind dask --name d1 --namespace team-a"
    )
    assert error.remedy_call == (
        'get_backend("local", state_dir="/tmp/my state/local").restore_baseline(ClusterRef("dask", "d1", "team-a"))'
    )
    assert "desired_workers=3 left in place: 1 of 3 workers ready" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.left_in_place, copy.remedy_command, str(copy)) == (error.left_in_place, error.remedy_command, str(error))

    python_only = Reach("kubernetes", ClusterRef("ray", "r1", "ns"), options={"context": "prod"}, cli=False)
    error = left_in_place(WorkerFailedError("pod r1-ray-worker-2 failed", pod="p", reason="CrashLoopBackOff"),
                          python_only, "spec.worker.replicas", 4, restoring=True)
    assert error.remedy_command is None and "ddlscale" not in str(error)
    assert "the workers were never observed" in str(error)
    assert error.remedy_call == 'get_backend("kubernetes", context="prod").wait_for_workers(ClusterRef("ray", "r1", "ns"), 4)'

    unreachable = pickle.loads(pickle.dumps(UnreachableWaitError(5, desired=2, maximum=4, cluster="ray/x")))
    assert (unreachable.field, unreachable.value, unreachable.desired, unreachable.maximum) == ("replicas", 5, 2, 4)


# ----- part 5: one base: the same input checks, `with` and connection_env on every backend -----

BAD_INPUT = [
    ("scale", lambda b, ref: b.scale(ref, -1), "replicas"),
    ("scale", lambda b, ref: b.scale(ref, True), "replicas"),
    ("scale", lambda b, ref: b.scale(ref, 2, "  "), "worker_hw_tier"),
    ("scale", lambda b, ref: b.scale(ref, 2, timeout=0), "timeout"),
    ("wait", lambda b, ref: b.wait_for_workers(ref, 1, timeout=float("nan")), "timeout"),
    ("restart", lambda b, ref: b.restart_head(ref, "", timeout=30), "head_hw_tier"),
    ("restore", lambda b, ref: b.restore_baseline(ref, target=3), "target"),
    ("restore", lambda b, ref: b.restore_baseline(ref, target=ReplicaSpec(-2)), "target.replicas"),
    ("reconcile", lambda b, ref: b.reconcile(ref, target=ReplicaSpec(2, worker_hw_tier="")), "target.worker_hw_tier"),
    ("claim", lambda b, ref: b.claim(ref, "", 2), "claim_id"),
    ("claim", lambda b, ref: b.claim(ref, "phase-a", 1.5), "replicas"),
    ("release", lambda b, ref: b.release(ref, None), "claim_id"),
    ("get_state", lambda b, ref: b.get_state(f"{ref.kind}/{ref.name}"), "ref"),
]


def test_bad_input_is_refused_alike_by_every_backend_before_anything_changes(world):
    for _, call, field_name in BAD_INPUT:
        with pytest.raises(InvalidInputError) as caught:
            call(world.backend, world.ref)
        assert caught.value.field == field_name, (field_name, caught.value)
    assert world.desired() == 1
    assert world.backend.get_baseline(world.ref) is None and world.backend.claims(world.ref) == {}


def test_a_kind_the_backend_does_not_serve_is_refused_before_any_request(world):
    unserved = sorted(set(KINDS) - world.backend.capabilities.kinds)
    if not unserved:
        pytest.skip(f"the {world.backend.name} backend serves every kind")
    ref = ClusterRef(unserved[0], "other")
    for call in (
        lambda: world.backend.get_state(ref),
        lambda: world.backend.scale(ref, 1),
        lambda: world.backend.claim(ref, "a", 1),
        lambda: world.backend.claims(ref),
        lambda: world.backend.connection_env(ref),
    ):
        with pytest.raises(UnsupportedOperationError, match=unserved[0]):
            call()
    assert world.desired() == 1


def test_every_backend_is_a_context_manager_offering_connection_env(world):
    from flytekitplugins_ddlscale.backends import ClusterBackend
    from flytekitplugins_ddlscale.backends._base import BaseBackend

    assert isinstance(world.backend, BaseBackend) and isinstance(world.backend, ClusterBackend)
    with world.backend as backend:
        assert backend is world.backend
        env = backend.connection_env(world.ref)
        assert observed(backend.get_state(world.ref)) == 1
    if world.backend.name == "local":
        record = world.backend.store.load(world.ref)
        tls = world.backend.store.cluster_dir(world.ref) / "tls"
        assert env == {
            "DASK_SCHEDULER_SERVICE_HOST": record.host, "DASK_SCHEDULER_SERVICE_PORT": str(record.port),
            "DASK_SCHEDULER_ADDRESS": f"tls://{record.host}:{record.port}",
            "DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME": "tls", "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(tls / "ca.pem"),
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(tls / "cluster.pem"),
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(tls / "cluster-key.pem"),
        }
    elif world.ref.kind == "kuberay":
        host = f"{world.ref.name}-head-svc.domino-compute.svc"
        assert env == {"RAY_ADDRESS": f"ray://{host}:10001", "RAY_HEAD_SERVICE_HOST": host,
                       "RAY_HEAD_SERVICE_PORT": "10001"}
    elif world.ref.kind == "dask-operator":
        assert env == {"DASK_SCHEDULER_SERVICE_HOST": f"{world.ref.name}-scheduler.domino-compute.svc",
                       "DASK_SCHEDULER_SERVICE_PORT": "8786"}
    else:
        assert env == {}  # on Domino the platform injects the head's address itself


# ----- part 6: claims are leases, a phase holds at least N and gives back what it found -----


def test_a_phase_holds_at_least_its_claim_and_gives_back_the_size_it_found(world):
    world.backend.scale(world.ref, 2, timeout=60)  # a node before the phases: baseline 1
    world.backend.claim(world.ref, "small", 1)
    world.backend.reconcile(world.ref, timeout=60)
    assert world.desired() == 2  # at least 1: a cluster found larger is not shrunk
    world.backend.claim(world.ref, "big", 3)
    world.backend.reconcile(world.ref, timeout=60)
    assert world.desired() == 3
    world.backend.release(world.ref, "big")
    world.backend.reconcile(world.ref, timeout=60)
    assert world.desired() == 2  # "small" still holds; never below the size found
    world.backend.release(world.ref, "small")
    world.backend.reconcile(world.ref, timeout=60)
    assert world.desired() == 2 and world.backend.claims(world.ref) == {}
    assert world.backend.get_baseline(world.ref).replicas == 1  # kept for RestoreCluster / ddlscale restore
    world.backend.restore_baseline(world.ref, timeout=60)
    assert world.desired() == 1 and world.backend.get_baseline(world.ref) is None


def test_phases_that_changed_nothing_else_forget_the_baseline_they_put_back(world):
    world.backend.claim(world.ref, "p", 2)
    world.backend.reconcile(world.ref, timeout=60)
    world.backend.release(world.ref, "p")
    assert world.backend.reconcile(world.ref, timeout=60).effective == 1
    assert world.desired() == 1 and world.backend.get_baseline(world.ref) is None


def test_a_lapsed_claim_stops_counting_and_the_next_reconcile_drops_it_naming_its_holder(world, caplog):
    from flytekitplugins_ddlscale._core.leases import this_holder

    from flytekitplugins_ddlscale._core.leases import expires_at
    from flytekitplugins_ddlscale.models import utcnow

    # Its holder never renews: a dead pod. The lease outlasts the reconcile (3 s: a real API server).
    world.backend.claim(world.ref, "stale", 3, lease_seconds=3.0)
    world.backend.reconcile(world.ref, wait=False, timeout=60)
    assert world.desired() == 3
    ends = expires_at(world.backend.claims(world.ref)["stale"])
    time.sleep(max((ends - utcnow()).total_seconds(), 0.0) + 0.1)
    assert world.backend.claims(world.ref) == {}
    with caplog.at_level(logging.WARNING, logger="flytekitplugins_ddlscale"):
        world.backend.reconcile(world.ref, timeout=60)
    assert world.desired() == 1
    assert f"dropped claim stale (3 workers, holder {this_holder()}): its lease of 3s ran out" in caplog.text


def test_a_renewed_claim_outlives_its_lease(world):
    from flytekitplugins_ddlscale._core.leases import expires_at
    from flytekitplugins_ddlscale.models import utcnow

    # Renewals 0.7 s apart on a 2 s lease: the claim outlives its first lease by 0.1 s, and a renewal call
    # may take 1.3 s on a loaded machine before the test itself would let the claim lapse.
    made = world.backend.claim(world.ref, "kept", 2, lease_seconds=2)
    for _ in range(3):
        time.sleep(0.7)
        assert world.backend.renew(world.ref, "kept") is not None
    assert utcnow() > expires_at(made)
    assert set(world.backend.claims(world.ref)) == {"kept"}
    world.backend.release(world.ref, "kept")
    assert world.backend.renew(world.ref, "kept") is None


def test_a_renewed_or_reclaimed_claim_keeps_when_it_was_made_so_ties_go_to_the_phase_that_claimed_first(world):
    made = world.backend.claim(world.ref, "first", 2).created_at
    time.sleep(0.01)
    assert world.backend.claim(world.ref, "second", 2).claim_id == "first"  # a tie: the older claim wins
    time.sleep(0.01)
    renewed = world.backend.renew(world.ref, "first")
    moment = datetime.datetime.fromisoformat
    assert renewed.created_at == made and moment(renewed.renewed_at) > moment(made)
    assert world.backend.claim(world.ref, "first", 2).claim_id == "first"  # a re-claim is no younger
    assert world.backend.claims(world.ref)["first"].created_at == made
    assert world.backend.release(world.ref, "first").claim_id == "second"


def test_a_claim_waits_for_no_other_phase_s_scale_up_wait(world):
    """Phase A is inside its wait for workers (held there by its progress callback, a hook this test
    controls); phase B's claim must get the record (and cluster) locks within its own 3 s timeout."""
    in_wait, go_on = threading.Event(), threading.Event()
    outcome: List[object] = []

    def progress(update) -> None:
        in_wait.set()
        go_on.wait(60)

    def phase_a() -> None:
        try:
            world.backend.claim(world.ref, "a", 3)
            outcome.append(world.backend.reconcile(world.ref, timeout=120, progress=progress))
        except BaseException as exc:  # reported below
            outcome.append(exc)

    thread = threading.Thread(target=phase_a)
    thread.start()
    try:
        assert in_wait.wait(60), outcome
        world.backend.claim(world.ref, "b", 2, timeout=3.0)
        assert set(world.backend.claims(world.ref)) == {"a", "b"}
    finally:
        go_on.set()
        thread.join(120)
    assert not isinstance(outcome[0], BaseException), outcome
    assert world.desired() == 3


def test_status_lists_live_claims_with_holder_and_age(world):
    from flytekitplugins_ddlscale._core.leases import this_holder

    world.backend.claim(world.ref, "phase-a", 2)
    ran = run_shell(world.command("status", "--json"), **world.shell_env)
    assert ran.returncode == 0, ran.stderr
    claims = json.loads(ran.stdout)["claims"]
    assert [(c["claim_id"], c["replicas"], c["holder"]) for c in claims] == [("phase-a", 2, this_holder())]
    assert 0 <= claims[0]["age_seconds"] < 120 and claims[0]["lease_seconds"] == 90
    ran = run_shell(world.command("status"), **world.shell_env)
    assert ran.returncode == 0, ran.stderr
    assert f"phase-a: at least 2 workers, holder {this_holder()}, age " in ran.stdout


@pytest.mark.parametrize("point", ["claimed", "body"])
def test_a_killed_run_s_claim_dies_with_it_and_its_command_too(world, tmp_path, point):
    """``ddlscale run`` is killed with SIGKILL at a chosen point (the pause hook, or in its command's
    body): its claim no longer counts, its command is gone, and the next run ends at the size found."""
    import subprocess

    child_pid = tmp_path / "command.pid"
    body = f"echo $$ > {child_pid}; exec sleep 120"
    command = world.command("run", "--replicas", "3", "--no-framework-ready", "--timeout", "120", "--", "sh", "-c",
                            f"'{body}'")
    # exec: the shell becomes ddlscale (through the pause launcher when it pauses), so the pid killed is its own.
    pause = Pause("claimed") if point == "claimed" else None
    runner = " ".join(pause.argv()) if pause is not None else "ddlscale"
    proc = subprocess.Popen(["bash", "-c", command.replace("ddlscale run", f"exec {runner} run", 1)],
                            env=shell_environment(**world.shell_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, pass_fds=pause.fds if pause is not None else ())

    def claimed() -> None:
        assert set(world.backend.claims(world.ref)) != set()

    if pause is not None:
        pause.child_started()
        kill_once_paused(proc, pause, before_kill=claimed)
    else:
        kill_once_marked(proc, child_pid, point, before_kill=claimed)
    assert world.backend.claims(world.ref) == {}  # its holder process is gone: the claim no longer counts
    if point == "body":
        pid = int(child_pid.read_text())
        ends = time.monotonic() + 10
        while _running(pid) and time.monotonic() < ends:
            time.sleep(0.05)
        assert not _running(pid), "the command outlived the ddlscale run that held the cluster for it"
        assert world.desired() == 3
    ran = run_shell(world.command("run", "--replicas", "1", "--no-framework-ready", "--timeout", "120", "--", "true"),
                    **world.shell_env)
    assert ran.returncode == 0, ran.stderr
    assert world.desired() == 1, ran.stderr  # the size found before the killed run, not its 3
    assert world.backend.claims(world.ref) == {}


def _running(pid: int) -> bool:
    from flytekitplugins_ddlscale._core.leases import process_start

    return process_start(pid) is not None


# ----- claim records are checked like input (issue 30, part 3) -----


def plant_claims(world: World, text: str) -> None:
    """Write ``text`` as ``world``'s claims record, where its backend keeps it (as anyone who can write
    the state directory, or patch the cluster object, can)."""
    backend = world.backend
    if hasattr(backend, "records"):
        from flytekitplugins_ddlscale.backends._support.filerecords import CLAIMS_KEY

        backend.records.store.update(world.ref, lambda record: record.__setitem__(CLAIMS_KEY, text))
        return
    from flytekitplugins_ddlscale._core.records import CLAIMS_ANNOTATION

    adapter = backend._adapter(world.ref)
    patch = {"metadata": {"annotations": {CLAIMS_ANNOTATION: text}}}
    backend.api.patch_object(backend._resource(world.ref), world.ref.namespace, adapter.object_name(world.ref), patch)


def test_a_claim_renewed_far_ahead_is_a_corrupt_record_for_claims_reconcile_and_run(world):
    """Renewed "in 9999": not live for ever, nor a raw OverflowError (2999 and others: test_core_records)."""
    from flytekitplugins_ddlscale.errors import CorruptRecordError

    claim = {"claim_id": "planted", "replicas": 5, "holder": "elsewhere:1", "lease_seconds": 90,
             "created_at": "2026-01-01T00:00:00+00:00", "renewed_at": "9999-12-31T23:59:59+00:00"}
    plant_claims(world, json.dumps({"planted": claim}))
    before = world.desired()
    for call in (lambda: world.backend.claims(world.ref), lambda: world.backend.reconcile(world.ref, timeout=30)):
        with pytest.raises(CorruptRecordError) as caught:
            call()
        assert caught.value.field == "claims['planted'].renewed_at"
    ran = run_shell(world.command("run", "--replicas", "1", "--no-framework-ready", "--", "true"), **world.shell_env)
    assert ran.returncode not in (0, 1) and "Traceback" not in ran.stderr and "OverflowError" not in ran.stderr
    [line] = [line for line in ran.stderr.splitlines() if "renewed_at" in line]
    assert "claims['planted'].renewed_at" in line
    assert world.desired() == before


# ----- a lost claim is a fault on every backend (issue 33) -----


def test_a_stopped_phase_whose_claim_lapsed_claims_again_or_fails_on_the_fault(world, tmp_path):
    """Two ``ddlscale run --replicas 3`` with a 4 s lease are stopped (SIGSTOP) past it; another phase
    drops their lapsed claims and the cluster goes back to 1; on SIGCONT the plain run claims again and
    the cluster comes back to 3 before its command goes on, the one with --fail-on-fault exits 6. (The
    operators' worlds and the local one run the same phase code; test_cli_run stages it on local Dask.)"""
    import signal
    import subprocess

    if world.backend.name == "local" or world.ref.kind not in ("ray", "dask"):
        pytest.skip("the same phase code as the dco worlds; the local run is tests/test_cli_run.py's")
    runs, started, go = {}, {}, tmp_path / "go"
    for label, extra in (("plain", ()), ("failing", ("--fail-on-fault",))):
        started[label] = tmp_path / label
        body = f"touch {started[label]}; while [ ! -e {go} ]; do sleep 0.05; done"
        command = world.command("run", "--replicas", "3", "--lease-seconds", "4", "--no-framework-ready",
                                "--timeout", "120", *extra, "--", "sh", "-c", f"'{body}'")
        # exec: the shell becomes ddlscale, so the pid stopped is ddlscale's own.
        runs[label] = subprocess.Popen(
            ["bash", "-c", command.replace("ddlscale run", "exec ddlscale run", 1)],
            env=shell_environment(**world.shell_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def until(what: str, check: Callable[[], bool], alive: tuple = ("plain", "failing")) -> None:
        ends = time.monotonic() + 120
        while not check():
            assert all(runs[label].poll() is None for label in alive), f"a run ended before {what}"
            assert time.monotonic() < ends, f"never saw {what}"
            time.sleep(0.05)

    try:
        until("both commands running", lambda: all(path.exists() for path in started.values()))
        assert world.desired() == 3 and len(world.backend.claims(world.ref)) == 2
        for run in runs.values():
            stop_outside_locks(run.pid)
        until("both stopped runs' claims lapse", lambda: world.backend.claims(world.ref) == {})
        world.backend.claim(world.ref, "other", 1)  # drops both lapsed claims
        assert world.backend.reconcile(world.ref, wait=False, timeout=60).effective == 1
        world.backend.release(world.ref, "other")
        world.backend.reconcile(world.ref, wait=False, timeout=60)
        assert world.desired() == 1
    finally:
        for run in runs.values():
            run.send_signal(signal.SIGCONT)
    try:
        # The --fail-on-fault run may exit 6 as soon as it resumes: only the plain one must live on.
        until("the plain run's cluster back at 3", lambda: world.desired() == 3, alive=("plain",))
        go.touch()
        plain, failing = (runs[label].communicate(timeout=120) for label in ("plain", "failing"))
    except AssertionError as missed:
        # Seen once in CI on the real API server and not since: keep what the runs said.
        said = {}
        for label, run in runs.items():
            if run.poll() is None:
                run.kill()
            said[label] = run.communicate(timeout=30)[1][-3000:]
        raise AssertionError(f"{missed}; desired {world.desired()}, claims {world.backend.claims(world.ref)}; "
                             f"the runs said: {said}") from None
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.communicate(timeout=30)
    assert runs["plain"].returncode == 0, plain[1]
    assert "lapsed: this process did not run or could not renew it" in plain[1]
    assert "claimed again and the cluster brought back to its size" in plain[1], plain[1]
    assert runs["failing"].returncode == 6, failing[1]
    assert "[cluster_fault]" in failing[1] and "lapsed" in failing[1]
    assert world.desired() == 1 and world.backend.claims(world.ref) == {}
