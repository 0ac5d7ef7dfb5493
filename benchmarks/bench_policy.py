"""What a per-project policy adds to a connector's CreateTask (issue 46: at most 1 ms).

``python -m benchmarks.bench_policy [--creates N] [--rules R]``. The scaler
test server (this process) holds ``dask/a-0``; a policy of ``R`` rules is
written whose covering rule is the last one (the slowest match: every rule
before it is tried), with every limit set (backends, namespaces, kinds,
clusters, max_workers, tiers). Two figures:

* the check alone: ``ProjectRules.rule_for`` and ``ScalingService._check_rule``
  (what ``create`` adds before it sends), timed over ``N`` creates, in wall
  clock and in the thread's CPU time (what the check costs without the
  preemption of a loaded machine);
* whole creates (``ScalingService.create`` of a ScaleCluster, its HTTP round
  trips to the test server included) with and without the policy,
  interleaved so that machine noise hits both alike.

Results: median and 99th percentile in milliseconds, printed and written to
``benchmarks/results/policy_check.json``; docs/benchmarks.md, "Per-project
policy (issue 46)".
"""
import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from benchmarks.stats import median

WARMUP = 20


def _rules(count: int) -> str:
    lines = ["rules:"]
    for index in range(count - 1):
        lines.append(f"  - name: other-{index}\n    match: {{project: other-{index}, domain: [development]}}\n"
                     f"    allow: {{clusters: ['dask/o-{index}-*'], max_workers: 4}}")
    lines.append("  - name: team-a\n    match: {project: team-a, domain: [development, staging]}\n"
                 "    allow: {backends: [scaler], namespaces: [domino-compute], kinds: [dask], clusters: ['dask/a-*'],"
                 " max_workers: 8, tiers: ['small*']}")
    return "\n".join(lines) + "\n"


def _percentile(values: List[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _figures(values: List[float]) -> Dict[str, float]:
    kept = values[WARMUP:]  # the first creates open the backend and warm the caches
    return {share: round(_percentile(kept, value), 4) if value != 0.5 else round(median(kept), 4)
            for share, value in (("median_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99))}


def _timed(fn: Callable[[], Any], clock: Callable[[], float] = time.perf_counter) -> float:
    started = clock()
    fn()
    return (clock() - started) * 1000.0


def run(creates: int, rules: int) -> Dict[str, Any]:
    from flytekitplugins_ddlscale._services.connector_core import ScalingService
    from flytekitplugins_ddlscale._services.connector_policy import ConnectorPolicy, Execution
    from flytekitplugins_ddlscale._services.nodes import NODE_KINDS
    from tests.servers.scaler_server import DEFAULT_API_KEY, ScalerTestServer

    workdir = Path(tempfile.mkdtemp(prefix="ddlscale-bench-policy-"))
    policy = workdir / "policy.yaml"
    policy.write_text(_rules(rules))
    with ScalerTestServer() as server:
        server.add_cluster("dask", "a-0", replicas=1, max_replicas=8)
        os.environ.update(CLUSTER_SCALER_BASE_URL=server.url, DOMINO_API_KEY=DEFAULT_API_KEY, DDLSCALE_STATE_DIR=str(workdir))
        with_policy = ScalingService(ConnectorPolicy.from_env({"DDLSCALE_CONNECTOR_POLICY": str(policy)}))
        without = ScalingService(ConnectorPolicy.from_env({}))
        kind = NODE_KINDS["ddlscale_scale"]
        custom = {"cluster": "dask/a-0", "replicas": 2, "backend": "scaler", "timeout": 60, "wait": False}
        execution = Execution("team-a", "development", "bench", "n0", "team-a-development", "default", "")
        config = kind.config.from_custom(custom)
        checks, cpu, plain, checked = [], [], [], []
        for index in range(creates):
            values = {"cluster": "dask/a-0", "replicas": 1 + index % 2}

            def check() -> None:
                rule = with_policy.policy.rules.rule_for(execution)
                with_policy._check_rule(rule, kind, config, kind.given(config, values))

            checks.append(_timed(check))
            cpu.append(_timed(check, time.thread_time))  # the same check's CPU time: what preemption does not add
            plain.append(_timed(lambda: without.create("ddlscale_scale", custom, values, execution)))
            checked.append(_timed(lambda: with_policy.create("ddlscale_scale", custom, values, execution)))
    return {"creates": creates, "rules": rules, "check": _figures(checks), "check_cpu": _figures(cpu),
            "create_without_policy": _figures(plain),
            "create_with_policy": _figures(checked)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=2000)
    parser.add_argument("--rules", type=int, default=50)
    args = parser.parse_args()
    result = run(args.creates, args.rules)
    out = Path("benchmarks/results/policy_check.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
