"""The connector service under FlytePropeller's driver while the real kube-apiserver is stopped.

The connector (``pyflyte serve connector``, Kubernetes backend, the admin's
kubeconfig) scales a DCO Ray cluster; right after ``CreateTask`` the API
server is stopped with SIGSTOP (connections accepted by the kernel, nothing
answered) for 60 s, then continued. The driver (``tests/propeller_driver.py``) runs on
FlytePropeller's own figures: 10 s call deadlines, GetTask every 5 s, given
up past 5 failed syncs. Wanted: no failed call, and the node SUCCEEDED with
its typed outcome once the server is back. A control plane of this module's
own, so the session's shared one is never stopped.
"""
import os
import signal
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from flytekitplugins_ddlscale.tasks import ScaleOutcome
from tests.connector_fault_support import FAULT_SCALE
from tests.envtest.controlplane import ENV_DIR, missing_requirements
from tests.envtest.running import READY_DELAY, Envtest, start_envtest
from tests.envtest.sides import RealServerSide
from tests.flyte_support import SCALER_ENV
from tests.propeller_driver import CALL_TIMEOUT, RESYNC, PropellerDriver, typed_output
from tests.test_connector_service import SETTINGS, serving

pytestmark = [pytest.mark.envtest, pytest.mark.slow, pytest.mark.timeout(600)]

STOPPED = 60.0
"""Seconds the API server is stopped (twelve of FlytePropeller's 5 s resyncs)."""


@pytest.fixture(scope="module")
def stoppable() -> Iterator[Envtest]:
    """A control plane of this module's own (etcd, API server, controller-manager, DCO stand-in, kubelet)."""
    reasons = missing_requirements()
    if reasons:
        pytest.skip(f"envtest tier (real kube-apiserver) not run: {'; '.join(reasons)}")
    with start_envtest(Path(os.environ[ENV_DIR]), webhook=False) as running:
        yield running


def test_a_stopped_api_server_fails_no_call_and_the_node_succeeds_once_it_is_back(stoppable, tiers_file, tmp_path):
    from flytekit.tools.translator import get_serializable

    plane = stoppable.plane
    side = RealServerSide(tiers_file, stoppable)
    problems: List[BaseException] = []
    stopped: Dict[str, Any] = {}
    try:
        side.add_cluster("ray", "c1", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 5})
        side.set_ready_delay(3600.0, "c1")  # the new workers come only after the outage
        template = get_serializable(OrderedDict(), SETTINGS, FAULT_SCALE).template
        template.custom.update(cluster=f"{side.namespace}/ray/c1", timeout=300.0, framework_url=None)
        env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
        env.update(KUBECONFIG=str(plane.admin_kubeconfig), DDLSCALE_BACKEND="kubernetes",
                   DDLSCALE_TIERS_FILE=str(tiers_file), DDLSCALE_FRAMEWORK_READINESS="off",
                   DDLSCALE_STATE_DIR=str(tmp_path / "connector-state"))

        def back() -> None:
            try:
                os.kill(stopped["pid"], signal.SIGCONT)
                side.set_ready_delay(READY_DELAY, "c1")
                stoppable.kubelet._reactor.poke()
            except BaseException as error:  # reported by the assertion below
                problems.append(error)
            finally:
                stopped["back"] = True

        def stop(_node: Any) -> None:
            stopped["pid"] = plane.processes["kube-apiserver"].pid
            os.kill(stopped["pid"], signal.SIGSTOP)
            stopped["timer"] = threading.Timer(STOPPED, back)
            stopped["timer"].start()

        with serving(env) as channel:
            try:
                node = PropellerDriver(channel, resync=RESYNC, call_timeout=CALL_TIMEOUT).run(
                    template.to_flyte_idl(), None, "ddlscale_scale", node_timeout=400, on_created=stop)
            finally:
                if "timer" in stopped:
                    stopped["timer"].join(STOPPED + 120)  # the server is back before anything else runs
    finally:
        if not problems:
            side.close()
    assert problems == [] and stopped.get("back"), problems
    assert node.failed_calls == [] and node.phase == "SUCCEEDED", (node.phase, node.message, node.failed_calls)
    assert node.running_seen >= 2  # answered RUNNING while the server was stopped
    outcome = typed_output(node.outputs, ScaleOutcome)
    assert (outcome.previous_workers, outcome.workers) == (1, 3)
