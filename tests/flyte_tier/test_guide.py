"""The guide's pages as configuration: every YAML block of the deployment pages is a named guide block
(tests/flyte_tier/guide.py), and the sandbox walkthrough's `kubectl` steps work with the manifests as written.

Needs nothing but the repository: the charts these blocks configure are rendered in
tests/flyte_tier/test_flyte_charts.py, the manifests dry-run on a real API server in
tests/envtest/test_envtest_manifests.py."""
import re
import shlex
from pathlib import Path

import pytest
import yaml

from flytekitplugins_ddlscale._services.connector_policy import ConnectorPolicy
from flytekitplugins_ddlscale.refs import parse_cluster
from tests.flyte_tier.guide import GuideError, guide_blocks, guide_text, guide_yaml, yaml_fences

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_FLOW = ROOT / "examples" / "k8s_operator_flow.py"
PAGES = ["connector.md", "sandbox.md"]
NAMES = {"connector.md": ["connector-policy", "connector-policy-mount", "connector-service-monitor",
                          "propeller-connector-service", "flyte-binary-values", "flyte-core-values"],
         "sandbox.md": ["sandbox-extra-config"]}
# The namespaces `flytectl demo start` leaves: the sandbox's own (docker/sandbox-bundled/manifests/complete.yaml)
# and those of the project it seeds (flytesnacks), which its cluster resource manager creates.
SANDBOX_NAMESPACES = {"default", "kube-system", "flyte", "flytesnacks-development", "flytesnacks-staging",
                      "flytesnacks-production"}


@pytest.mark.parametrize("page", PAGES)
def test_every_yaml_block_of_the_deployment_pages_is_a_named_guide_block(page):
    fences = yaml_fences(page)
    assert fences, f"{page} has no ```yaml block"
    unnamed = [f"{page}:{block.line}" for block in fences if block.name is None]
    assert not unnamed, f"```yaml blocks without a <!-- guide: NAME --> marker on the line before: {unnamed}"
    assert list(guide_blocks(page)) == NAMES[page]  # the names tests/flyte_tier/ reads them by
    for name in NAMES[page]:
        assert isinstance(guide_yaml(page, name), dict)


def test_guide_blocks_are_read_as_the_convention_says(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- guide: one -->\n```yaml\na: 1\n```\n\n  <!-- guide: two -->\n  ```yaml\n  b:\n"
                    "    - 2\n  ```\n```yaml\nc: 3\n```\n```bash\n<!-- guide: not-a-marker -->\n```\n")
    assert guide_yaml(page, "one") == {"a": 1}
    assert guide_text(page, "two") == "b:\n  - 2\n"  # as a user copies it: the fence's indentation removed
    assert [block.name for block in yaml_fences(page)] == ["one", "two", None]
    with pytest.raises(GuideError, match=r"page.md: no guide block 'three'; the page names: one, two"):
        guide_yaml(page, "three")
    page.write_text("<!-- guide: one -->\n```yaml\na: 1\n```\n<!-- guide: one -->\n```yaml\na: 2\n```\n")
    with pytest.raises(GuideError, match=r"page.md:6: guide block 'one' is named twice \(first at line 2\)"):
        guide_blocks(page)
    page.write_text("<!-- guide: one -->\n\n```yaml\na: 1\n```\n")
    with pytest.raises(GuideError, match=r"page.md:1: a guide marker must be the line right before a ```yaml fence"):
        guide_blocks(page)
    page.write_text("<!-- guide: one -->\n```bash\nls\n```\n")
    with pytest.raises(GuideError, match=r"page.md:1: the marker of guide block 'one' is followed by a bash fence"):
        guide_blocks(page)
    page.write_text("<!-- guide: one -->\n```yaml\na: [1\n```\n")
    with pytest.raises(GuideError, match=r"page.md:2: guide block 'one' is not YAML"):
        guide_yaml(page, "one")


def _commands(page):
    """The shell commands of the page's ```bash blocks, in order (continuations joined, comments dropped)."""
    text = (ROOT / "docs" / page).read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def _walkthrough():
    """What the sandbox walkthrough applies and creates: ([manifest paths applied], {namespaces created})."""
    applied, created = [], set()
    for words in _commands("sandbox.md"):
        if words[:3] == ["kubectl", "create", "namespace"]:
            created.add(words[3])
        if words[0] == "helm" and "--create-namespace" in words:
            created.add(words[words.index("-n") + 1])
        if words[:2] == ["kubectl", "apply"]:
            applied.append(ROOT / words[words.index("-f") + 1])
    return applied, created


def _documents(paths):
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_the_sandbox_walkthrough_applies_only_to_namespaces_it_has():
    applied, created = _walkthrough()
    assert applied, "the walkthrough applies no manifest"
    namespaces = SANDBOX_NAMESPACES | created
    outside = sorted({(doc["kind"], doc["metadata"]["name"], doc["metadata"]["namespace"])
                      for doc in _documents(applied) if doc["metadata"].get("namespace", "default") not in namespaces})
    assert not outside, f"objects in namespaces neither the sandbox nor the walkthrough creates: {outside}"


def test_the_sandbox_walkthroughs_connector_serves_and_may_scale_the_example_cluster():
    applied, _ = _walkthrough()
    documents = _documents(applied)
    deployment = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "ddlscale-connector")
    account = (deployment["spec"]["template"]["spec"]["serviceAccountName"], deployment["metadata"]["namespace"])
    cluster = parse_cluster(re.search(r'"DDLSCALE_EXAMPLE_CLUSTER", "([^"]+)"', EXAMPLE_FLOW.read_text()).group(1))
    # The connector's own policy, from the Deployment's environment, serves the example's cluster ...
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    policy = ConnectorPolicy.from_env(env)
    policy.backend("kubernetes")
    policy.check_cluster(cluster, backend=None)
    # ... and an applied RoleBinding in the cluster's namespace gives its service account an applied Role there.
    roles = {d["metadata"]["name"] for d in documents if d["kind"] == "Role"
             and d["metadata"]["namespace"] == cluster.namespace}
    bound = [d for d in documents if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] == cluster.namespace
             and d["roleRef"]["name"] in roles
             and any((s["name"], s.get("namespace")) == account for s in d["subjects"])]
    assert bound, f"no RoleBinding the walkthrough applies binds {account} in namespace {cluster.namespace}"
