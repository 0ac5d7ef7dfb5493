"""Per-project rules, the audit trail and metrics of the connector, and its metadata across versions (issue 46).

A deployment's policy file ($DDLSCALE_CONNECTOR_POLICY) says what each Flyte project and domain may use; the
execution comes from what FlytePropeller sends with CreateTask (flytekit's TaskExecutionMetadata, built here
from the same protobuf FlytePropeller v1.16.8 fills in). A refusal is one line naming the rule, FAILED at the
first GetTask, and sends nothing: checked against the scaler test server's request log.
"""
import asyncio
import json
import logging
import subprocess
import sys

import pytest
from flyteidl.admin import agent_pb2
from flyteidl.core import identifier_pb2, security_pb2
from flyteidl.core.execution_pb2 import TaskExecution
from flytekit.models.task import TaskExecutionMetadata
from prometheus_client import REGISTRY

from flytekitplugins_ddlscale.connector import ScalingConnector, ScalingMetadata
from flytekitplugins_ddlscale._services.connector_policy import ConnectorPolicy, Execution, served_at_start
from flytekitplugins_ddlscale.errors import InvalidInputError
from flytekitplugins_ddlscale.tasks import SCALE_TASK_TYPE, WAIT_TASK_TYPE, ScaleCluster, WaitForCluster
from tests.framework_support import use_scaler
from tests.servers.scaler_server import ScalerTestServer
from tests.test_connector import template_and_inputs

IMAGE = "registry/flows:v1"
POLICY = """\
# Two teams share one connector.
rules:
  - name: team-a
    match: {project: team-a, domain: [development, staging]}
    allow:
      backends: [scaler]
      namespaces: [domino-compute]
      kinds: [dask]
      clusters: ["dask/a-*"]
      max_workers: 3
      tiers: ["small*"]
  - name: team-b
    match: {project: team-b}
    allow: {clusters: ["dask/b-*"]}
"""

scale_node = ScaleCluster("policy_scale", cluster="dask/a-one", replicas=2, backend="scaler", container_image=IMAGE)
wait_node = WaitForCluster("policy_wait", cluster="dask/a-one", replicas=9, timeout=60, backend="scaler",
                           container_image=IMAGE)


def sent_by_propeller(project, domain="development", *, name="f1abc", identity="", namespace=None):
    """The TaskExecutionMetadata flytekit's service hands ``create``, from the protobuf FlytePropeller sends."""
    run = identifier_pb2.WorkflowExecutionIdentifier(project=project, domain=domain, name=name)
    task = identifier_pb2.TaskExecutionIdentifier(
        node_execution_id=identifier_pb2.NodeExecutionIdentifier(node_id="n0", execution_id=run))
    return TaskExecutionMetadata.from_flyte_idl(agent_pb2.TaskExecutionMetadata(
        task_execution_id=task, namespace=f"{project}-{domain}" if namespace is None else namespace,
        k8s_service_account="default", identity=security_pb2.Identity(execution_identity=identity),
    ))


@pytest.fixture
def served(tmp_path, monkeypatch):
    """The scaler test server with dask/a-one and dask/b-one (1 worker each), and a connector policy file."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    with ScalerTestServer(pod_ready_delay=0.1) as server:
        server.add_cluster("dask", "a-one", replicas=1, max_replicas=8)
        server.add_cluster("dask", "b-one", replicas=1, max_replicas=8)
        use_scaler(monkeypatch, server, tmp_path / "state")
        for name in ("DDLSCALE_CONNECTOR_BACKENDS", "DDLSCALE_CONNECTOR_NAMESPACES", "DDLSCALE_CONNECTOR_CLUSTERS"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("DDLSCALE_CONNECTOR_POLICY", str(policy))
        server.clear_requests()
        yield server


def create(node, task_type, metadata, **values):
    template, inputs = template_and_inputs(node, **values)
    return ScalingConnector(task_type).create(template, "", inputs, metadata)


def refusal(served, meta):
    """The refused create's one line, FAILED at its first get; nothing reached the backend."""
    assert meta.error and meta.cluster == "" and served.requests == [], meta
    resource = asyncio.run(ScalingConnector(SCALE_TASK_TYPE).get(ScalingMetadata.decode(meta.encode())))
    assert resource.phase == TaskExecution.FAILED and resource.message == meta.error and "\n" not in meta.error
    return meta.error


def creates(project, kind, result, backend="scaler"):
    labels = {"project": project, "backend": backend, "kind": kind, "result": result}
    return REGISTRY.get_sample_value("ddlscale_connector_creates_total", labels) or 0.0


def test_each_project_scales_what_its_rule_allows_and_is_refused_the_rest(served):
    before = creates("team-a", "ScaleCluster", "sent"), creates("team-b", "ScaleCluster", "refused")
    meta = create(scale_node, SCALE_TASK_TYPE, sent_by_propeller("team-a"), replicas=3)
    assert meta.error == "" and meta.project == "team-a" and served.count("PATCH") == 1
    assert served.cluster_object("dask", "a-one")["spec"]["worker"]["replicas"] == 3
    served.clear_requests()
    cases = [
        (sent_by_propeller("team-a"), dict(replicas=4), "invalid replicas=4: rule 'team-a'"),
        (sent_by_propeller("team-a"), dict(cluster="dask/b-one"), "invalid clusters='dask/b-one': rule 'team-a'"),
        (sent_by_propeller("team-a"), dict(worker_hw_tier="large"), "invalid worker_hw_tier='large': rule 'team-a'"),
        (sent_by_propeller("team-a", "production"), {}, "invalid project='team-a/production': no rule"),
        (sent_by_propeller("team-b"), {}, "invalid clusters='dask/a-one': rule 'team-b'"),
        (sent_by_propeller("team-c"), {}, "invalid project='team-c/development': no rule"),
    ]
    for metadata, values, line in cases:
        message = refusal(served, create(scale_node, SCALE_TASK_TYPE, metadata, **{"replicas": 2, **values}))
        assert message.startswith(f"[not_served] {line}") and "$DDLSCALE_CONNECTOR_POLICY" in message, message
    # The other project's cluster is untouched; the counts say what happened, by project.
    assert served.cluster_object("dask", "b-one")["spec"]["worker"]["replicas"] == 1
    assert creates("team-a", "ScaleCluster", "sent") == before[0] + 1
    assert creates("team-b", "ScaleCluster", "refused") == before[1] + 1


def test_a_wait_is_not_limited_by_sizes_and_team_b_scales_its_own(served):
    meta = create(wait_node, WAIT_TASK_TYPE, sent_by_propeller("team-a", "staging"))
    assert meta.error == ""  # waiting for 9 changes nothing: max_workers limits changes
    meta = create(scale_node, SCALE_TASK_TYPE, sent_by_propeller("team-b"), cluster="dask/b-one", replicas=6)
    assert meta.error == "" and served.cluster_object("dask", "b-one")["spec"]["worker"]["replicas"] == 6


@pytest.mark.parametrize("metadata, line", [
    (None, "invalid project='/': no rule"),
    (TaskExecutionMetadata.from_flyte_idl(agent_pb2.TaskExecutionMetadata()), "invalid project='/': no rule"),
    (sent_by_propeller("x" * 100_000), "invalid execution.project='xxx"),
    (sent_by_propeller("téam-a☃"), "invalid project='téam-a☃/development': no rule"),
    (object(), "invalid project='/': no rule"),
])
def test_hostile_metadata_is_refused_in_one_line_sending_nothing(metadata, line, served):
    message = refusal(served, create(scale_node, SCALE_TASK_TYPE, metadata, replicas=2))
    assert message.startswith(f"[") and line in message and len(message) < 600, message


def test_without_a_policy_metadata_changes_nothing(served, monkeypatch):
    monkeypatch.delenv("DDLSCALE_CONNECTOR_POLICY")
    for metadata in (None, object(), sent_by_propeller("y" * 100_000)):
        served.clear_requests()
        assert create(scale_node, SCALE_TASK_TYPE, metadata, replicas=2).error == "" and served.requests


class Raising:
    @property
    def task_execution_id(self):
        raise RuntimeError("hostile")


def test_the_execution_is_read_from_what_flytepropeller_sends():
    got = Execution.of(sent_by_propeller("team-a", "staging", name="r1", identity="alice@example.com"))
    assert got == Execution("team-a", "staging", "r1", "n0", "team-a-staging", "default", "alice@example.com")
    assert Execution.of(Raising()) == Execution() == Execution.of(None)


@pytest.mark.parametrize("text, line", [
    ("rules:\n  - name: a\n    allow: {max_wokers: 3}\n",
     "invalid policy.rules[0].allow.max_wokers=3: unknown key; allowed: backends, namespaces, kinds, clusters, "
     "max_workers, tiers, owner"),
    ("rule: []\n", "invalid policy.rule=[]: unknown key; allowed: rules"),
    ("rules:\n  - name: a\n    match: {projet: x}\n", "invalid policy.rules[0].match.projet='x': unknown key"),
    ("rules:\n  - name: a\n  - name: a\n", "invalid policy.rules.name='a'"),
    ("rules:\n  - match: {project: a}\n", "invalid policy.rules[0].name=None"),
    ("rules:\n  - name: a\n    allow: {max_workers: -1}\n", "invalid policy.rules[0].allow.max_workers=-1"),
    ("rules:\n  - name: a\n    allow: {clusters: []}\n", "invalid policy.rules[0].allow.clusters=[]"),
    ("rules: [\n", "invalid DDLSCALE_CONNECTOR_POLICY="),
    ("- just\n- a list\n", "invalid policy='list'"),
])
def test_a_bad_policy_stops_the_connector_at_start_in_one_line(text, line, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInputError) as raised:
        served_at_start({"DDLSCALE_CONNECTOR_POLICY": str(path)})
    assert str(raised.value).startswith(f"[invalid_input] {line}") and "\n" not in str(raised.value), str(raised.value)


def test_the_start_says_whether_a_policy_applies(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    _, notes = served_at_start({"DDLSCALE_CONNECTOR_POLICY": str(path), "DDLSCALE_BACKEND": "scaler"})
    assert notes == (f"per-project policy {path}: 2 rules",)
    _, notes = served_at_start({"DDLSCALE_BACKEND": "scaler"})
    assert notes == ("no per-project policy ($DDLSCALE_CONNECTOR_POLICY unset): every project may use all this "
                     "connector serves",)
    with pytest.raises(InvalidInputError, match="DDLSCALE_CONNECTOR_POLICY='/nonexistent'"):
        ConnectorPolicy.from_env({"DDLSCALE_CONNECTOR_POLICY": "/nonexistent"})


def test_every_create_is_one_audit_line(served, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale.connector.audit")
    create(scale_node, SCALE_TASK_TYPE, sent_by_propeller("team-a", identity="alice"), replicas=3)
    create(scale_node, SCALE_TASK_TYPE, sent_by_propeller("team-b"), replicas=3)
    lines = [r.getMessage() for r in caplog.records if r.name == "flytekitplugins_ddlscale.connector.audit"]
    assert len(lines) == 2 and all(line.startswith("ddlscale-audit {") for line in lines)
    sent, refused = (json.loads(line.split(" ", 1)[1]) for line in lines)
    assert {k: sent[k] for k in ("execution", "project", "domain", "identity", "backend", "cluster", "before",
                                 "after", "rule", "result")} == {
        "execution": "team-a/development/f1abc/n0", "project": "team-a", "domain": "development",
        "identity": "alice", "backend": "scaler", "cluster": "dask/a-one", "before": 1, "after": 3,
        "rule": "team-a", "result": "sent"}
    assert (refused["project"], refused["rule"], refused["result"], refused["cluster"]) == (
        "team-b", "team-b", "refused", "dask/a-one")
    assert "rule 'team-b'" in refused["error"] and refused["before"] is None


def test_importing_the_package_registers_no_metric_and_a_connector_does():
    code = (
        "import flytekitplugins_ddlscale, flytekitplugins_ddlscale.connector_entry\n"
        "from prometheus_client import REGISTRY\n"
        "names = lambda: {n for n in REGISTRY._names_to_collectors if n.startswith('ddlscale_')}\n"
        "assert names() == set(), names()\n"
        "from flytekitplugins_ddlscale._services.connector_core import ScalingService\n"
        "assert names() == set(), names()\n"
        "service = ScalingService(); print(sorted(names()))\n"
        "try: service.create('ddlscale_scale', {'cluster': 'dask/x'}, {})\n"
        "except Exception as error: print(type(error).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ddlscale_connector_creates_total" in out.stdout and "ddlscale_connector_worker_wait_seconds" in out.stdout
    # Logging not set up (as in pyflyte serve connector): the audit line still reaches stderr.
    assert '"result":"refused"' in out.stderr and "ddlscale-audit {" in out.stderr, out.stderr[-2000:]


# ----- metadata across versions -----

def test_metadata_says_which_version_wrote_it_and_reads_the_one_before_and_after():
    meta = ScalingMetadata("ddlscale_scale", "dask/x", "", 2, 1.0, 100.0, "{}", project="p")
    written = json.loads(meta.encode())
    assert written["writer"] == __import__("flytekitplugins_ddlscale").__version__
    # The version before: no writer, no project.
    older = {key: value for key, value in written.items() if key not in ("writer", "project")}
    read = ScalingMetadata.decode(json.dumps(older).encode())
    assert read.error == "" and (read.writer, read.project, read.target) == ("", "", 2)
    # The version after: a field this one does not know is kept, and written back as it came.
    newer = dict(written, writer="9.0.0", placement={"zone": "b"})
    read = ScalingMetadata.decode(json.dumps(newer).encode())
    assert read.error == "" and read.writer == "9.0.0" and read.unknown == {"placement": {"zone": "b"}}
    assert json.loads(read.encode()) == newer


# ----- the owner a rule maps an execution to (Kubernetes: the cluster's starting-user-id label) -----

k8s_scale = ScaleCluster("policy_k8s_scale", cluster="ray/mine", replicas=2, backend="kubernetes", container_image=IMAGE)


def test_on_kubernetes_a_rule_s_owner_is_checked_on_the_cluster_s_label(tmp_path, monkeypatch):
    from tests.contract_support import write_kubeconfig
    from tests.servers.k8s_server import K8sTestServer

    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  - name: alice\n    match: {project: team-a}\n    allow: {owner: u-alice}\n")
    monkeypatch.setenv("DDLSCALE_CONNECTOR_POLICY", str(policy))
    monkeypatch.delenv("DDLSCALE_CONNECTOR_BACKENDS", raising=False)
    with K8sTestServer() as server:
        for name, owner in (("mine", "u-alice"), ("theirs", "u-bob"), ("no-label", None)):
            server.add_cluster("ray", name, replicas=1, owner=owner)
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server.url)))
        assert create(k8s_scale, SCALE_TASK_TYPE, sent_by_propeller("team-a"), replicas=2).error == ""
        assert server.get_object("ray", "mine")["spec"]["worker"]["replicas"] == 2
        for name, found in (("theirs", "'u-bob'"), ("no-label", "None")):
            server.clear_log()
            meta = create(k8s_scale, SCALE_TASK_TYPE, sent_by_propeller("team-a"), cluster=f"ray/{name}", replicas=3)
            assert meta.error.startswith("[unauthorized] ") and f"starting-user-id={found}, not 'u-alice'" in meta.error
            assert server.count("PATCH") == 0 and server.get_object("ray", name)["spec"]["worker"]["replicas"] == 1


def test_the_first_rule_covering_an_execution_applies_whatever_its_patterns(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("rules:\n  - {name: a-prod, match: {project: team-a, domain: production}}\n"
                    "  - {name: any-dev, match: {project: 'team-*', domain: development}}\n"
                    "  - {name: team-a, match: {project: [team-a, team-a2]}}\n  - {name: rest}\n")
    rules = ConnectorPolicy.from_env({"DDLSCALE_CONNECTOR_POLICY": str(path)}).rules
    for project, domain, name in (("team-a", "production", "a-prod"), ("team-a", "development", "any-dev"),
                                  ("team-a2", "staging", "team-a"), ("team-a", "staging", "team-a"),
                                  ("team-*", "staging", "rest"), ("x", "y", "rest")):
        assert rules.rule_for(Execution(project, domain)).name == name, (project, domain)


def test_the_policy_docs_connector_md_shows_is_one_the_connector_reads(tmp_path):
    from flytekitplugins_ddlscale.refs import ClusterRef
    from tests.flyte_tier.guide import guide_text

    path = tmp_path / "policy.yaml"
    path.write_text(guide_text("connector.md", "connector-policy"))
    rules = ConnectorPolicy.from_env({"DDLSCALE_CONNECTOR_POLICY": str(path)}).rules
    assert [rule.name for rule in rules.rules] == ["team-a", "team-a-production", "everyone-else"]
    team_a = rules.rule_for(Execution("team-a", "staging"))
    team_a.check("kubernetes", ClusterRef("dask", "a-1", "team-a"), "team-a", {"replicas": 16, "worker_hw_tier": "small-x"})
    with pytest.raises(InvalidInputError, match="rule 'team-a'"):
        team_a.check("kubernetes", ClusterRef("dask", "a-1", "team-a"), "team-a", {"replicas": 17})
    assert rules.rule_for(Execution("team-a", "production", identity="bob@example.com")).name == "team-a-production"
    assert rules.rule_for(Execution("team-a", "production", identity="bob@elsewhere.org")).name == "everyone-else"


def test_flyte_2_s_connector_decides_on_the_execution_c0_hands_create(served):
    # flyte's c0 hands create the request's protobuf itself (flyteidl2): the same field names.
    pytest.importorskip("flyte", reason="the Flyte 2 connector needs the flyte2 extra")
    from flyteidl2.connector import connector_pb2
    from flyteidl2.core import identifier_pb2 as ids, security_pb2 as security, tasks_pb2
    from google.protobuf import json_format
    from google.protobuf.struct_pb2 import Struct

    from flytekitplugins_ddlscale._services.nodes.scale import ScaleConfig
    from flytekitplugins_ddlscale.flyte2.connector import ScalingConnector as Flyte2Connector

    run = ids.WorkflowExecutionIdentifier(project="team-b", domain="production", name="r2")
    metadata = connector_pb2.TaskExecutionMetadata(
        task_execution_id=ids.TaskExecutionIdentifier(
            node_execution_id=ids.NodeExecutionIdentifier(node_id="a0", execution_id=run)),
        namespace="team-b-production", k8s_service_account="runner",
        identity=security.Identity(execution_identity="bob"))
    assert Execution.of(metadata) == Execution("team-b", "production", "r2", "a0", "team-b-production", "runner", "bob")
    config = ScaleConfig(cluster="dask/a-one", replicas=2, backend="scaler", wait=False)
    template = tasks_pb2.TaskTemplate(type=SCALE_TASK_TYPE, custom=json_format.ParseDict(config.to_custom(), Struct()))
    meta = asyncio.run(Flyte2Connector(SCALE_TASK_TYPE).create(template, "", task_execution_metadata=metadata))
    assert "invalid clusters='dask/a-one': rule 'team-b'" in refusal(served, meta)
    run.project, run.domain = "team-a", "development"
    metadata.task_execution_id.node_execution_id.execution_id.CopyFrom(run)
    meta = asyncio.run(Flyte2Connector(SCALE_TASK_TYPE).create(template, "", task_execution_metadata=metadata))
    assert meta.error == "" and meta.project == "team-a" and served.count("PATCH") == 1
