"""The real FlytePropeller v1.16.8: the quick start to Success, and a scaling node's time beyond its workers' Ready.

On the flyte tier (tests/flyte_tier/plane.py: FlytePropeller built from its Go
module, a real kube-apiserver, the process kubelet, a stock ``pyflyte serve
connector``, configured with the resync interval docs/sandbox.md recommends),
once with the connector and once without (every node a pod):

* ``quick_start_s``: ``examples/hybrid_flow.py``'s ``hybrid_flow`` (``n`` 5000),
  from handing the execution to FlytePropeller (``kubectl-flyte create``, what
  flyteadmin does for ``pyflyte run --remote``) until its FlyteWorkflow says
  Success;
* ``beyond_ready_s``: a ``ScaleCluster`` to 2 local Dask workers held back by
  a gate (tests/flyte_tier/gated_worker.py) until its node is RUNNING; then
  the gate opens, and the figure is the arrival of the node's SUCCEEDED event
  at flyteadmin's event API (what the UI then shows) minus the moment the last
  worker went on to register (its Ready moment, but for the milliseconds of
  registration).
"""
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.report import BenchResult
from benchmarks.stats import summarize

NAME = "flyte_propeller"
TITLE = "Real FlytePropeller: quick start to Success, scaling node's time beyond Ready (connector, container)"
RUNNING, SUCCEEDED = 2, 3


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """``3`` runs of each figure per mode; ``quick``: one beyond-Ready run with the connector (the suite's smoke
    test: the tier's time is bounded)."""
    from tests.envtest.controlplane import ENV_DIR, missing_requirements
    from tests.flyte_tier.peers import MissingPeer, find_peers

    reasons = missing_requirements()
    try:
        peers = find_peers()
    except MissingPeer as exc:
        reasons.append(str(exc))
    if reasons:
        return BenchResult.skipped(NAME, TITLE, "; ".join(reasons))
    runs = 1 if quick else 3
    result = BenchResult(NAME, TITLE)
    headline: List[str] = []
    modes = (("connector", True),) if quick else (("connector", True), ("container", False))
    for mode, connector in modes:
        figures = _measure(peers, Path(os.environ[ENV_DIR]), connector, runs, quick_start=not quick)
        result.metrics[mode] = {name: summarize(values, 3) for name, values in figures.items() if values}
        result.metrics[mode]["raw"] = figures
        line = f"{mode}: " + ", ".join(
            f"{label} median {result.metrics[mode][name]['median']:.1f} s (max {result.metrics[mode][name]['max']:.1f} s)"
            for name, label in (("quick_start_s", "quick start"), ("beyond_ready_s", "beyond Ready"))
            if name in result.metrics[mode])
        headline.append(line)
    from tests.flyte_tier.guide import guide_yaml

    resync = guide_yaml("sandbox.md", "sandbox-extra-config")["plugins"]["connector-service"]["webApi"]["caching"]
    result.metrics["resync_interval"] = resync["resyncInterval"]
    result.metrics["runs"] = runs
    result.metrics["headline"] = headline
    result.notes.append("Reported, no target: real processes on a shared 2-core machine; the connector's figure "
                        "is bounded by the resync interval the guide recommends.")
    return result


def _measure(peers, envtest: Path, connector: bool, runs: int, quick_start: bool) -> Dict[str, List[float]]:
    """Both figures' samples on one plane (with the connector or without)."""
    from tests.flyte_apps.gated import gated
    from tests.flyte_tier import gated_worker
    from tests.flyte_tier.plane import FlytePlane
    from tests.flyte_tier.plane import quick_start as example

    hybrid_flow = example("dask/bench-flyte").hybrid_flow
    gate = Path(tempfile.mkdtemp(prefix="ddlscale-bench-gate-")) / "open"
    gate.touch()
    env = {"DASK_DISTRIBUTED__WORKER__PRELOAD": repr([gated_worker.__file__]),
           "DASK_DDLSCALE_TEST_WORKER_GATE": str(gate), "DDLSCALE_EXAMPLE_PREPARE_SECONDS": "0"}
    figures: Dict[str, List[float]] = {"quick_start_s": [], "beyond_ready_s": []}
    try:
        with FlytePlane(peers, envtest, connector=connector, pod_env=env,
                        connector_env={"DDLSCALE_CONNECTOR_BACKENDS": "local", **env}) as plane:
            for index in range(runs):
                if quick_start:
                    started = time.monotonic()
                    ended = plane.run(hybrid_flow, {"n": 5000, "workers": 2}, timeout=300)
                    if ended.phase != "Success":
                        raise RuntimeError(f"quick start ended {ended.phase}: {ended.message}")
                    figures["quick_start_s"].append(time.monotonic() - started)
                figures["beyond_ready_s"].append(_beyond_ready(plane, gated, gate, f"gated{index}{int(time.time())}"))
    finally:
        shutil.rmtree(gate.parent, ignore_errors=True)
    return figures


def _beyond_ready(plane, gated, gate: Path, name: str) -> float:
    from tests.flyte_tier.gated_worker import released

    gate.unlink()
    Path(f"{gate}.released").unlink(missing_ok=True)
    try:
        plane.submit(gated, {}, name)
        node = plane.events.wait_for(
            lambda: next((e.parent_node_execution_id.node_id for e in plane.events.tasks_of(name)
                          if e.phase == RUNNING and e.task_id.name.endswith("gated_up")), None),
            "the scale-up node RUNNING", 180)
    finally:
        gate.touch()
    ended = plane.wait(name, 180)
    if ended.phase != "Success":
        raise RuntimeError(f"gated flow ended {ended.phase}: {ended.message}")
    # When flyteadmin hears of the node's end: an event's own occurred_at is the pod's finishedAt in container
    # mode, which the process kubelet writes, as a kubelet does, to the second.
    done = next(at for at, e in zip(plane.events.task_received, plane.events.task_events)
                if e.phase == SUCCEEDED and e.parent_node_execution_id.node_id == node
                and e.parent_node_execution_id.execution_id.name == name)
    ready = released(str(gate))
    if len(ready) < 2:
        raise RuntimeError(f"{len(ready)} workers passed the gate, 2 expected")
    return done - ready[-1]
