"""The connector service under FlytePropeller's driver while the real kube-apiserver is stopped or restarted.

The connector (``pyflyte serve connector``, Kubernetes backend) runs as the
non-admin user the shipped Role binds (``examples/k8s/rbac.yaml``), as in a
deployment: the admin (``system:masters``) would skip the RBAC check that a
restarted API server fails for a moment while its authorization caches fill.
It scales a DCO Ray cluster; right after ``CreateTask`` the API server is,
for 60 s, either

- ``stopped``: SIGSTOP, connections accepted by the kernel, nothing
  answered; then continued;
- ``restarted``: SIGTERM, connections refused; then started again on the
  same port with the same data (``ControlPlane.start_apiserver``), which
  holds connections unanswered while it starts, then answers 403 to the
  user's requests until its RBAC caches have filled (a fraction of a second
  here, so a poll meets it in some runs only: before the 403 counted as part
  of the outage, those runs ended FAILED "Kubernetes refused to get
  rayclusters"; ``tests/reliability/test_reliability_outages.py`` stages the
  same 403 on every run).

The driver (``tests/propeller_driver.py``) runs on FlytePropeller's own
figures: 10 s call deadlines, GetTask every 5 s, given up past 5 failed
syncs. Wanted for both: no failed call, and the node SUCCEEDED with its typed
outcome once the server is back. A control plane of this module's own, so the
session's shared one is never stopped.
"""
import json
import os
import signal
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

from flytekitplugins_ddlscale.tasks import ScaleOutcome
from tests.connector_fault_support import FAULT_SCALE
from tests.envtest.controlplane import ENV_DIR, USER, ControlPlane, missing_requirements
from tests.envtest.running import READY_DELAY, Envtest, start_envtest
from tests.envtest.sides import RealServerSide
from tests.flyte_support import SCALER_ENV
from tests.propeller_driver import CALL_TIMEOUT, RESYNC, PropellerDriver, typed_output
from tests.test_connector_service import SETTINGS, serving

pytestmark = [pytest.mark.envtest, pytest.mark.own_control_plane, pytest.mark.slow, pytest.mark.timeout(600)]

RBAC = Path(__file__).resolve().parents[2] / "examples" / "k8s" / "rbac.yaml"
DOWN = 60.0
"""Seconds the API server is stopped or down (twelve of FlytePropeller's 5 s resyncs)."""


@pytest.fixture(scope="module")
def stoppable() -> Iterator[Envtest]:
    """A control plane of this module's own (etcd, API server, controller-manager, DCO stand-in, kubelet)."""
    reasons = missing_requirements()
    if reasons:
        pytest.skip(f"envtest tier (real kube-apiserver) not run: {'; '.join(reasons)}")
    with start_envtest(Path(os.environ[ENV_DIR]), webhook=False) as running:
        yield running


def _suspend(plane: ControlPlane) -> Callable[[], None]:
    """SIGSTOP the API server; returns what continues it."""
    pid = plane.processes["kube-apiserver"].pid
    os.kill(pid, signal.SIGSTOP)
    return lambda: os.kill(pid, signal.SIGCONT)


def _take_down(plane: ControlPlane) -> Callable[[], None]:
    """Stop the API server (SIGTERM); returns what starts it again on the same port with the same data."""
    plane.stop_apiserver()
    return plane.start_apiserver


FAULTS: Dict[str, Callable[[ControlPlane], Callable[[], None]]] = {"stopped": _suspend, "restarted": _take_down}


def user_answers(plane: ControlPlane) -> List[Tuple[str, int]]:
    """(verb, status) of every finished request of the non-admin user, from the API server's audit log."""
    answers = []
    for line in plane.audit_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("stage") == "ResponseComplete" and event["user"]["username"] == USER:
            answers.append((event["verb"], int(event.get("responseStatus", {}).get("code", 0))))
    return answers


@pytest.mark.parametrize("fault", list(FAULTS))
def test_an_api_server_down_for_a_minute_fails_no_call_and_the_node_succeeds_once_it_is_back(
    stoppable, tiers_file, tmp_path, fault
):
    from flytekit.tools.translator import get_serializable

    plane = stoppable.plane
    side = RealServerSide(tiers_file, stoppable)
    problems: List[BaseException] = []
    down: Dict[str, Any] = {}
    try:
        side.grant(RBAC)
        side.add_cluster("ray", "c1", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 5})
        side.set_ready_delay(3600.0, "c1")  # the new workers come only after the outage
        template = get_serializable(OrderedDict(), SETTINGS, FAULT_SCALE).template
        template.custom.update(cluster=f"{side.namespace}/ray/c1", timeout=300.0, framework_url=None)
        env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
        env.update(KUBECONFIG=str(plane.user_kubeconfig), DDLSCALE_BACKEND="kubernetes",
                   DDLSCALE_TIERS_FILE=str(tiers_file), DDLSCALE_FRAMEWORK_READINESS="off",
                   DDLSCALE_STATE_DIR=str(tmp_path / "connector-state"))
        answered_before = len(user_answers(plane))

        def take_down(_node: Any) -> None:
            down["restore"], down["at"] = FAULTS[fault](plane), time.monotonic()

        def bring_back(_node: Any) -> None:
            # In the driver's (main) thread, at its first RUNNING answer DOWN seconds on: a restarted API
            # server lives only as long as the thread that started it.
            if "back" in down or time.monotonic() - down["at"] < DOWN:
                return
            down["back"] = True
            try:
                down["restore"]()
                side.set_ready_delay(READY_DELAY, "c1")
                stoppable.kubelet._reactor.poke()
            except BaseException as error:  # reported by the assertion below
                problems.append(error)

        with serving(env) as channel:
            try:
                node = PropellerDriver(channel, resync=RESYNC, call_timeout=CALL_TIMEOUT).run(
                    template.to_flyte_idl(), None, "ddlscale_scale", node_timeout=400,
                    on_created=take_down, on_running=bring_back)
            finally:
                if "back" not in down and "restore" in down:
                    down["restore"]()  # the server is back before anything else runs
        answers = user_answers(plane)[answered_before:]
    finally:
        if not problems:
            side.close()
    refused = sum(1 for _, code in answers if code == 403)  # the restart's cold RBAC, when a poll met it
    assert problems == [] and down.get("back"), problems
    assert node.failed_calls == [] and node.phase == "SUCCEEDED", (
        node.phase, node.message, node.failed_calls, f"{refused} of the connector's requests answered 403")
    assert node.running_seen >= 2  # answered RUNNING while the server was down
    outcome = typed_output(node.outputs, ScaleOutcome)
    assert (outcome.previous_workers, outcome.workers) == (1, 3)
