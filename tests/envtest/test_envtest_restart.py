"""A real kube-apiserver restarted while the non-admin user's wait reads it.

A restarted API server listens before it serves, and then answers 403 for a
moment to a user whose Role it honoured a second earlier: its RBAC
authorizer's caches are still filling (measured here: 403 for 0.1 to 0.2 s,
after 2 to 4 s of "connection refused" and of connections held unanswered). A
wait must ride that out as part of the outage. The restarts use a control
plane of this module's own, so the session's shared one is never stopped.
"""
import logging
import os
import threading
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from flytekitplugins_ddlscale import ClusterRef

from tests.envtest.controlplane import ENV_DIR, missing_requirements
from tests.envtest.running import READY_DELAY, Envtest, start_envtest
from tests.envtest.sides import RealServerSide

pytestmark = [pytest.mark.envtest, pytest.mark.own_control_plane]

RBAC = Path(__file__).resolve().parents[2] / "examples" / "k8s" / "rbac.yaml"
AUTO = {"minReplicas": 1, "maxReplicas": 5}
RESTARTS = 3
"""Restarts at most, until the wait has met the restarted server's 403 (it met one at the first in every run so far)."""
SETTLE = 60.0
"""Seconds a restart may take until the wait's client has read the server again."""


@pytest.fixture(scope="module")
def restartable() -> Iterator[Envtest]:
    """A control plane of this module's own (etcd, API server, controller-manager, DCO stand-in, kubelet)."""
    reasons = missing_requirements()
    if reasons:
        pytest.skip(f"envtest tier (real kube-apiserver) not run: {'; '.join(reasons)}")
    with start_envtest(Path(os.environ[ENV_DIR]), webhook=False) as running:
        yield running


def refusals(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if r.name.startswith("flytekitplugins_ddlscale")
               and "answers HTTP 403 after its outage" in r.getMessage())


def test_a_wait_by_the_role_bound_user_rides_out_an_api_server_restart_and_its_cold_authorization(
    restartable, tiers_file, caplog
):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    plane = restartable.plane
    side = RealServerSide(tiers_file, restartable)
    outcome: Dict[str, Any] = {}
    try:
        side.grant(RBAC)
        side.add_cluster("ray", "c1", replicas=1, autoscaling=AUTO)
        side.set_ready_delay(3600.0, "c1")  # the new workers come only after the restarts
        ref = ClusterRef("ray", "c1", side.namespace)
        with side.backend(user=True) as backend:

            def scale() -> None:
                try:
                    outcome["result"] = backend.scale(ref, 3, timeout=300)
                except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                    outcome["error"] = exc

            waiting = threading.Thread(target=scale)
            waiting.start()
            side.wait_for(lambda: len(side.pods("c1", "worker")) == 3, "the scale to be applied (3 worker pods)")
            tracker = backend.api.outage
            for restart in range(RESTARTS):
                plane.stop_apiserver()
                plane.start_apiserver()
                side.wait_for(lambda: tracker.unreachable_since(0.0)[1] > restart and not tracker.down
                              or "error" in outcome, "the wait's client to read the restarted server", SETTLE)
                if refusals(caplog) or "error" in outcome:
                    break
            side.set_ready_delay(READY_DELAY, "c1")
            restartable.kubelet._reactor.poke()
            waiting.join(120)
    finally:
        side.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].final.ready_workers == 3
    assert refusals(caplog) >= 1, "no restart made the real API server answer the wait 403"
