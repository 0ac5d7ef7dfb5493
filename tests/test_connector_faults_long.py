"""FlytePropeller's contract on its own figures: backend faults of 60 s under the driver.

As ``test_connector_faults.py``, on what FlytePropeller v1.16.8 does by
default or at least: each call's deadline 10 s, GetTask every 5 s (the
shortest resync it accepts), at most 5 failed syncs, and the connector's
default call budget (7 s). The node's pods are ready 8 s after its scale,
so its first GetTask (at 5 s) is RUNNING and starts the fault. A 60 s fault
is twelve resyncs: a connector whose GetTask ran into the deadline would be
given up after the sixth.
Marked ``backend_faults``; each test has its own connector service (no
shared fixture), so pytest-xdist runs them in parallel with the rest.
"""
import pytest

from flytekitplugins_ddlscale.tasks import ScaleOutcome
from tests.connector_fault_support import FAULTS, StagedFault, fault_service, scale_node
from tests.propeller_driver import CALL_TIMEOUT, RESYNC, PropellerDriver, typed_output

pytestmark = [pytest.mark.slow, pytest.mark.backend_faults, pytest.mark.timeout(400)]

FAULT = 60.0


@pytest.mark.parametrize("kind", FAULTS)
def test_a_backend_away_for_60_s_fails_no_call_and_the_node_succeeds(tmp_path, kind):
    with fault_service(tmp_path) as (server, channel, hosts):
        template, inputs = scale_node(server, f"long-{kind}", timeout=300, pod_delay=8.0)
        fault = StagedFault(kind, server, hosts, FAULT)
        try:
            node = PropellerDriver(channel, resync=RESYNC, call_timeout=CALL_TIMEOUT).run(
                template, inputs, "ddlscale_scale", node_timeout=300, on_running=fault.on_running)
        finally:
            fault.close()
    assert fault.started.is_set() and fault.ended.is_set()
    assert node.failed_calls == [] and node.phase == "SUCCEEDED", (node.phase, node.message, node.failed_calls)
    assert typed_output(node.outputs, ScaleOutcome).workers == 3


def test_a_hang_outlasting_the_node_ends_it_failed_not_given_up(tmp_path):
    with fault_service(tmp_path) as (server, channel, hosts):
        template, inputs = scale_node(server, "long-outlast", timeout=30, pod_delay=8.0)
        fault = StagedFault("hang", server, hosts, FAULT)
        try:
            node = PropellerDriver(channel, resync=RESYNC, call_timeout=CALL_TIMEOUT).run(
                template, inputs, "ddlscale_scale", node_timeout=300, on_running=fault.on_running)
        finally:
            fault.close()
    assert node.failed_calls == [] and node.phase == "FAILED", (node.phase, node.message, node.failed_calls)
    # The last poll's read and the poll's own wait both end at the call budget (7 s), so either may end
    # the node: the poll saying the backend did not answer and what it last saw, or the read saying the
    # backend was unavailable at the deadline.
    late = "did not answer within 7 s" in node.message and "last known: waiting for 3 workers" in node.message
    unavailable = "[backend_unavailable]" in node.message
    assert late or unavailable, node.message
    # Either way the node says what the scale left in place and how to undo it.
    assert "spec.worker.replicas=3 left in place" in node.message and "restore_baseline" in node.message
