"""FlytePropeller's contract, proven through the real connector service under backend faults.

A driver that behaves as FlytePropeller's web-API plugin does
(:mod:`tests.propeller_driver`: a deadline on every call, GetTask every
resync, a failure count never reset that gives the node up past its limit,
RUNNING messages dropped, DeleteTask on abort) runs ScaleCluster nodes
while the scaler service hangs, is killed and restarted, or its name stops
resolving. Here the faults are short and the clock is scaled down (call
budget 1 s, call deadline 3 s, resync 0.5 s, faults of 4 s: eight syncs,
more than FlytePropeller's five failures); ``test_connector_faults_long.py``
runs them for 60 s on FlytePropeller's own figures.
"""
import pytest

from flytekitplugins_ddlscale.tasks import ScaleOutcome
from tests.connector_fault_support import FAULTS, StagedFault, fault_service, scale_node
from tests.propeller_driver import PropellerDriver, typed_output

pytestmark = pytest.mark.slow

BUDGET, CALL_TIMEOUT, RESYNC, FAULT = 1.0, 3.0, 0.5, 4.0


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with fault_service(tmp_path_factory.mktemp("faults"), BUDGET) as served:
        yield served


@pytest.mark.parametrize("kind", FAULTS)
def test_a_backend_fault_is_ridden_out_and_the_node_succeeds(service, kind):
    """No call fails while the backend is away; the node ends SUCCEEDED with its typed outcome once it is back."""
    server, channel, hosts = service
    template, inputs = scale_node(server, f"short-{kind}", timeout=120, pod_delay=1.0)
    fault = StagedFault(kind, server, hosts, FAULT)
    try:
        node = PropellerDriver(channel, resync=RESYNC, call_timeout=CALL_TIMEOUT).run(
            template, inputs, "ddlscale_scale", node_timeout=120, on_running=fault.on_running)
    finally:
        fault.close()
    assert fault.started.is_set() and fault.ended.is_set()
    assert node.failed_calls == [] and node.phase == "SUCCEEDED", (node.phase, node.message, node.failed_calls)
    outcome = typed_output(node.outputs, ScaleOutcome)
    assert isinstance(outcome, ScaleOutcome) and (outcome.previous_workers, outcome.workers) == (1, 3)
    assert node.custom_info["existing_workers"] == 3 and node.custom_info["desired_workers"] == 3
    assert node.log_links == [{"name": "Ray dashboard", "uri": "http://127.0.0.1:8265"}]


def test_a_fault_outlasting_the_node_ends_it_failed_saying_what_it_waited_for(service):
    """The scaler service hangs past the node's timeout: the connector, not the failure count, ends it."""
    server, channel, hosts = service
    template, inputs = scale_node(server, "short-outlast", timeout=4, pod_delay=1.0)
    fault = StagedFault("hang", server, hosts, 60.0)
    try:
        node = PropellerDriver(channel, resync=RESYNC, call_timeout=CALL_TIMEOUT).run(
            template, inputs, "ddlscale_scale", node_timeout=60, on_running=fault.on_running)
    finally:
        fault.close()
    assert node.failed_calls == [] and node.phase == "FAILED", (node.phase, node.message, node.failed_calls)
    assert "timed out after" in node.message and "did not answer within 1 s" in node.message
    assert "last known: waiting for 3 workers" in node.message and "\n" not in node.message


def test_an_abort_calls_delete_task_and_it_answers(service):
    server, channel, hosts = service
    template, inputs = scale_node(server, "short-abort", timeout=60, pod_delay=30.0)
    node = PropellerDriver(channel, resync=RESYNC, call_timeout=CALL_TIMEOUT).run(
        template, inputs, "ddlscale_scale", node_timeout=1.0)
    assert node.phase == "ABORTED" and (node.calls[0].method, node.calls[-1].method) == ("CreateTask", "DeleteTask")
    assert node.failed_calls == []
