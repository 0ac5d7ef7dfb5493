"""Two Flyte projects share one connector under a per-project policy, on the real FlytePropeller v1.16.8 (issue 46.6).

The connector (a stock ``pyflyte serve connector``) reads ``DDLSCALE_CONNECTOR_POLICY``; FlytePropeller runs
executions of ``team-a`` and ``team-b``, each in its namespace (``<project>-development``), and sends each
CreateTask the execution's metadata, which the policy decides on. Each project scales what its rule allows; what
it does not allow ends the execution FAILED with the rule's line, and the cluster it named is left as it was. The
connector's audit lines (its log) and ``ddlscale_*`` metrics (its Prometheus port) show both.
"""
import json
import os
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.envtest.controlplane import ENV_DIR
from tests.flyte_tier.peers import peers_or_skip
from tests.flyte_tier.plane import Execution, FlytePlane

pytestmark = [pytest.mark.flyte, pytest.mark.slow]

POLICY = """\
rules:
  - name: team-a
    match: {project: team-a, domain: development}
    allow: {backends: [local], clusters: ["dask/a-*"], max_workers: 2}
  - name: team-b
    match: {project: team-b}
    allow: {backends: [local], clusters: ["dask/b-*"], max_workers: 1}
"""


@pytest.fixture(scope="module")
def plane(tmp_path_factory) -> Iterator[FlytePlane]:
    peers = peers_or_skip()
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    policy.write_text(POLICY)
    env = {"DDLSCALE_CONNECTOR_BACKENDS": "local", "DDLSCALE_CONNECTOR_POLICY": str(policy)}
    with FlytePlane(peers, Path(os.environ[ENV_DIR]), connector_env=env, projects=("team-a", "team-b")) as plane:
        yield plane


def _said(execution: Execution) -> str:
    """Everything FlytePropeller wrote about the execution's end: its message and its nodes' statuses."""
    return execution.message + json.dumps(execution.nodes)


def _desired(plane: FlytePlane, cluster: str) -> int:
    from flytekitplugins_ddlscale.backends.local import LocalBackend
    from flytekitplugins_ddlscale.refs import ClusterRef

    with LocalBackend(state_dir=plane.state_dir / "local") as backend:
        return backend.get_state(ClusterRef.parse(cluster)).desired_workers


def _metrics(plane: FlytePlane) -> Dict[str, float]:
    """The connector's ddlscale_* samples: ``name{label=value,...}`` -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://127.0.0.1:{plane.connector_metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {f"{s.name}{{{','.join(f'{k}={v}' for k, v in sorted(s.labels.items()))}}}": s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name.startswith("ddlscale_")}


def _audit(plane: FlytePlane) -> List[Dict[str, object]]:
    log = (plane.work / "connector.log").read_text(errors="replace")
    return [json.loads(line.split("ddlscale-audit ", 1)[1]) for line in log.splitlines() if "ddlscale-audit {" in line]


def test_two_projects_share_one_connector_each_under_its_own_rules(plane):
    from tests.flyte_apps.tenants import tenant

    ran = [
        ("team-a", "dask/a-one", 1, "Success", ""),
        ("team-b", "dask/a-one", 0, "Failed", "invalid clusters='dask/a-one': rule 'team-b'"),
        ("team-a", "dask/a-one", 3, "Failed", "invalid replicas=3: rule 'team-a'"),
        ("team-b", "dask/b-one", 1, "Success", ""),
    ]
    names = []
    for project, cluster, replicas, phase, line in ran:
        execution = plane.run(tenant, {"cluster": cluster, "replicas": replicas}, project=project, timeout=180)
        assert execution.phase == phase, (project, cluster, _said(execution), plane.log("connector"))
        assert line in _said(execution) and "$DDLSCALE_CONNECTOR_POLICY" in _said(execution) if line else True
        names.append(execution.name)
        # The refusals left team-a's cluster as team-a's execution made it.
        assert _desired(plane, "dask/a-one") == 1
    assert _desired(plane, "dask/b-one") == 1
    audit = _audit(plane)
    assert [(a["execution"], a["cluster"], a["rule"], a["result"]) for a in audit] == [
        (f"{project}/development/{name}/n0", cluster, project, "sent" if phase == "Success" else "refused")
        for (project, cluster, _, phase, _), name in zip(ran, names)], audit
    assert [(a["before"], a["after"]) for a in audit] == [(0, 1), (None, None), (None, None), (0, 1)], audit
    metrics = _metrics(plane)
    for project, result in (("team-a", "sent"), ("team-a", "refused"), ("team-b", "sent"), ("team-b", "refused")):
        key = f"ddlscale_connector_creates_total{{backend=local,kind=ScaleCluster,project={project},result={result}}}"
        assert metrics.get(key) == 1.0, (key, metrics)
    for project in ("team-a", "team-b"):
        waited = f"ddlscale_connector_worker_wait_seconds_count{{backend=local,kind=ScaleCluster,project={project}}}"
        assert metrics.get(waited) == 1.0, (waited, metrics)
