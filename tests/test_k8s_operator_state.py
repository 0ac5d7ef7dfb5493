"""The state of KubeRay and Dask-operator clusters: the head's readiness from the head pod, the status
from what each operator documents (KubeRay's ``status.state``, the Dask scheduler pod), and the counts
of every wait's start and end; and a held size as a floor under the Dask autoscaler. Against the test
server's simulated operators; the envtest tier checks the same against the real Dask operator and
KubeRay's pod labels (tests/envtest/test_envtest_operator_state.py, test_envtest_dask_operator.py)."""
import pytest
from tests.servers.k8s_fixtures import backend, k8s, tiers_file  # noqa: F401 - fixtures

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.errors import UnreachableWaitError
from flytekitplugins_ddlscale.backends.kubernetes._resources.kuberay import cluster_status
from flytekitplugins_ddlscale.backends.kubernetes._resources.daskop import scheduler_status

RAY = ClusterRef("kuberay", "r1")
DASK = ClusterRef("dask-operator", "d1")
AUTOSCALERS = "daskautoscalers.kubernetes.dask.org"


def _add(k8s, ref):  # noqa: F811
    if ref.kind == "kuberay":
        k8s.add_kuberay("r1", groups=[{"groupName": "workers", "replicas": 1, "maxReplicas": 6}], autoscaling=True)
    else:
        k8s.add_dask_operator("d1", replicas=1)


@pytest.mark.parametrize("ref", [RAY, DASK], ids=["kuberay", "dask-operator"])
def test_every_state_reports_the_ready_head_and_a_running_status(k8s, backend, ref):  # noqa: F811
    _add(k8s, ref)
    assert backend.get_state(ref).status == "Running" and backend.get_state(ref).head_ready is True
    # The state a wait starts from (here: one refused as unreachable) is read with the pods.
    with pytest.raises(UnreachableWaitError) as caught:
        backend.wait_for_workers(ref, 7, timeout=20)
    assert (caught.value.state.status, caught.value.state.head_ready, caught.value.state.ready_workers) == (
        "Running", True, 1)
    scaled = backend.scale(ref, 2, timeout=20)
    assert (scaled.final.status, scaled.final.head_ready, scaled.final.ready_workers) == ("Running", True, 2)
    # A head restart's final state counts the workers too, not just the new head.
    restarted = backend.restart_head(ref, timeout=20)
    assert restarted.final.head_ready is True and restarted.final.ready_workers == 2


def test_kuberay_states_read_as_every_backend_words_them():
    def obj(state):
        return {"status": {"state": state}} if state else {}

    assert cluster_status(obj("ready"), True) == "Running"
    assert cluster_status(obj("failed"), True) == "Failed"
    assert cluster_status(obj("suspended"), False) == "Stopped"
    assert cluster_status(obj(None), True) == "Starting"
    assert cluster_status(obj(None), False) == "Pending"


def test_dask_status_follows_the_scheduler_pod():
    def pod(ready):
        return {"metadata": {"name": "s"}, "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}

    assert scheduler_status([pod(True)]) == "Running"
    assert scheduler_status([pod(False)]) == "Starting"
    assert scheduler_status([]) == "Pending"


def test_a_wait_for_the_held_size_ends_while_the_dask_autoscaler_runs_more(k8s, backend):  # noqa: F811
    k8s.add_dask_operator("d1", replicas=1, autoscaler={"minimum": 1, "maximum": 6})
    k8s.set_dask_desired("d1", 5)  # the scheduler wants 5: the autoscaler grows the group past the held 3
    k8s.set_ready_delay(0.5, "d1")
    k8s.set_hpa_window(0.05)
    result = backend.scale(DASK, 3, timeout=20)
    assert result.effective == 3 and result.final.ready_workers >= 3
    assert result.final.desired_workers >= 3
    assert k8s.get_resource(AUTOSCALERS, "d1")["spec"]["minimum"] == 3
    k8s.wait_for(lambda: backend.get_state(DASK).desired_workers == 5, 10, "the autoscaler to want 5")
    state = backend.wait_for_workers(DASK, 3, timeout=20)
    assert state.desired_workers == 5 and state.ready_workers >= 3
