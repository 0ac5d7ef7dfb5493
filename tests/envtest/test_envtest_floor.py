"""A held size is a floor: an autoscaler may run a cluster above it, and a wait for the held size ends
once that many workers are Ready, reporting the counts it found (not the ones it sent).

Run on both servers (``side``). The HPA is played by the admin patching ``spec.worker.replicas``
above the held ``minReplicas`` while the backend waits; the DCO stand-in's StatefulSet (the real
StatefulSet controller on the real server) then makes the extra pods.
"""
import threading
from typing import Any, Dict

import pytest
from kubernetes import client

from flytekitplugins_ddlscale import ClusterRef
from flytekitplugins_ddlscale.errors import ScalingTimeoutError
from flytekitplugins_ddlscale._services.nodes.scale import ScaleOutcome, scale_line
from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION, LAYOUTS

AUTO = {"minReplicas": 1, "maxReplicas": 6}


def _autoscale(side, kind: str, name: str, replicas: int) -> None:
    """What the HPA does: set ``spec.worker.replicas`` (within the autoscaling bounds)."""
    client.CustomObjectsApi(side.admin_client()).patch_namespaced_custom_object(
        CRD_GROUP, CRD_VERSION, side.namespace, LAYOUTS[kind].plural, name, {"spec": {"worker": {"replicas": replicas}}})


def _scale_in_background(backend, ref: ClusterRef, replicas: int, timeout: float) -> Dict[str, Any]:
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = backend.scale(ref, replicas, timeout=timeout)
        except Exception as error:  # handed to the test's thread
            outcome["error"] = error

    outcome["thread"] = threading.Thread(target=run, daemon=True)
    outcome["thread"].start()
    return outcome


def _raise_once_held(side, kind: str, name: str, held: int, raised: int) -> None:
    side.wait_for(lambda: side.get_object(kind, name)["spec"]["worker"]["replicas"] == held,
                  f"the scale's patch to {held} workers")
    _autoscale(side, kind, name, raised)


def test_a_scale_ends_once_the_held_size_is_ready_while_the_autoscaler_runs_more(side):
    side.add_cluster("ray", "c1", replicas=1, autoscaling=AUTO)
    side.set_ready_delay(3.0, cluster="c1")  # new workers are not Ready before the HPA raises the size
    ref = ClusterRef("ray", "c1", side.namespace)
    with side.backend() as backend:
        running = _scale_in_background(backend, ref, 3, timeout=40)
        _raise_once_held(side, "ray", "c1", 3, 5)
        running["thread"].join(60)
    assert "error" not in running, running.get("error")
    result = running["result"]
    assert (result.requested, result.effective) == (3, 3)
    assert result.final.desired_workers == 5 and result.final.ready_workers >= 3
    assert side.get_object("ray", "c1")["spec"]["autoscaling"]["minReplicas"] == 3  # the floor stays held
    line = scale_line("up", ScaleOutcome.from_result(result, backend.name))
    ready = result.final.ready_workers
    assert f"1 -> {ready} workers ready (at least 3 held; the cluster wants 5)" in line


def test_a_wait_for_fewer_than_the_cluster_runs_ends_at_once(side):
    side.add_cluster("dask", "d1", replicas=4, autoscaling={"minReplicas": 2, "maxReplicas": 6})
    ref = ClusterRef("dask", "d1", side.namespace)
    with side.backend() as backend:
        state = backend.wait_for_workers(ref, 2, timeout=20)
    assert (state.desired_workers, state.ready_workers, state.head_ready) == (4, 4, True)


def test_a_timed_out_wait_reports_the_size_it_found_not_the_one_it_sent(side):
    side.add_cluster("spark", "s1", replicas=1, autoscaling=AUTO)
    side.set_ready_delay(120, cluster="s1")  # no new worker becomes Ready
    ref = ClusterRef("spark", "s1", side.namespace)
    with side.backend() as backend:
        running = _scale_in_background(backend, ref, 3, timeout=8)
        _raise_once_held(side, "spark", "s1", 3, 5)
        running["thread"].join(60)
    error = running.get("error")
    assert isinstance(error, ScalingTimeoutError), running
    assert error.left_in_place == "spec.worker.replicas=5"
    text = str(error)
    assert "spec.worker.replicas=5 left in place (this change set 3; since changed by the autoscaler" in text
    assert "1 of 5 workers ready, at least 3 needed" in text
    assert "=3 left in place" not in text


def test_a_failed_restore_names_the_size_found_and_a_wait_that_can_end():
    from flytekitplugins_ddlscale.backends._support.inplace import Reach, left_in_place
    from flytekitplugins_ddlscale.models import ClusterState

    reach = Reach("kubernetes", ClusterRef("ray", "c1", "ns"))
    # The restore set 4; the HPA, back at the baseline's minimum, has since lowered it to 2.
    lowered = ScalingTimeoutError("timed out", state=ClusterState("ns/ray/c1", "Running", 2, 3, ready_workers=1))
    error = left_in_place(lowered, reach, "spec.worker.replicas", 4, restoring=True, found=2)
    assert error.left_in_place == "spec.worker.replicas=2"
    assert "=2 (the restore) left in place (this change set 4; since changed by the autoscaler" in str(error)
    assert "1 of 2 workers ready, at least 4 needed" in str(error)
    assert error.remedy_call.endswith(".wait_for_workers(ClusterRef(\"ray\", \"c1\", \"ns\"), 2)")
    # Found as sent: the text is the one every backend gave before.
    same = left_in_place(ScalingTimeoutError("timed out", state=ClusterState("ns/ray/c1", "Running", 4, 3, 3)),
                         reach, "spec.worker.replicas", 4, restoring=False, found=4)
    assert "spec.worker.replicas=4 left in place: 3 of 4 workers ready; nothing was rolled back" in str(same)
