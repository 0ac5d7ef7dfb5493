"""Flows the flyte tier runs under staged backend faults (tests/flyte_tier/test_flyte_faults.py), on the scaler
service's clusters (the scaler test server in the tier): Flyte retries, aborts and deadlines."""
import time
from datetime import timedelta
from pathlib import Path
from typing import List

from flytekit import task, workflow

from flytekitplugins_ddlscale import distributed_phase
from flytekitplugins_ddlscale.tasks import RestartHead, RestartOutcome, ScaleCluster, ScaleOutcome

RESTARTED = "ray/faults-restart"
"""The head restarted by :func:`restart_flow` (the scaler service restarts Ray heads only)."""
OUTAGE = "ray/faults-outage"
PHASED = "dask/faults-phase"
ABORTED_PHASE = "dask/faults-abort"
HELD = "ray/faults-held"
"""Workers of these clusters come only when the test says (the scaler test server's pod delay)."""
SLOW = "ray/faults-slow"
DEADLINE = "ray/faults-deadline"
BAD = "ray/faults-bad"

restart_retried = RestartHead("restart_retried", cluster=RESTARTED, timeout=60, retries=1)
scale_outage = ScaleCluster("scale_outage", cluster=OUTAGE, replicas=2, timeout=60, retries=1)
scale_bad = ScaleCluster("scale_bad", cluster=BAD, replicas=2, timeout=60, retries=1)
scale_held = ScaleCluster("scale_held", cluster=HELD, replicas=2, timeout=600)
scale_slow = ScaleCluster("scale_slow", cluster=SLOW, replicas=2, timeout=2)
scale_deadline = ScaleCluster("scale_deadline", cluster=DEADLINE, replicas=2, timeout=600)


@workflow
def restart_flow() -> RestartOutcome:
    """One head restart, retried once by Flyte."""
    return restart_retried()


@workflow
def outage_flow() -> ScaleOutcome:
    """One scale, retried once by Flyte."""
    return scale_outage()


@workflow
def bad_input_flow(replicas: int) -> ScaleOutcome:
    """A scale asked for ``replicas`` workers (a negative count is bad input), retried once by Flyte."""
    return scale_bad(replicas=replicas)


@workflow
def held_flow() -> ScaleOutcome:
    """A scale whose workers come only when the test says."""
    return scale_held()


@workflow
def slow_flow() -> ScaleOutcome:
    """A scale whose own timeout (2 s) is shorter than its workers take."""
    return scale_slow()


@workflow
def deadline_flow() -> ScaleOutcome:
    """A scale whose Flyte node timeout (5 s, ``with_overrides``) is shorter than its own (600 s) and than its
    workers take: FlytePropeller's node deadline ends it."""
    return scale_deadline().with_overrides(timeout=timedelta(seconds=5))


@task(retries=1)
@distributed_phase(cluster=PHASED, replicas=2, timeout=60, sample_interval=0.2)
def phase_sum(values: List[int]) -> int:
    """A phase's body: the sum of ``values`` while the cluster has 2 workers."""
    return sum(values)


@workflow
def phase_flow() -> int:
    """One phased task, retried once by Flyte."""
    return phase_sum(values=[1, 2, 3])


@task
@distributed_phase(cluster=ABORTED_PHASE, replicas=2, timeout=60, sample_interval=0.2)
def phase_forever(marker: str) -> int:
    """A phase's body that writes ``marker`` and then runs until it is stopped (SIGTERM)."""
    Path(marker).write_text("in the body")
    while Path(marker).exists():
        time.sleep(3600)
    return 0


@workflow
def aborted_phase_flow(marker: str) -> int:
    """One phased task that only an abort ends."""
    return phase_forever(marker=marker)
