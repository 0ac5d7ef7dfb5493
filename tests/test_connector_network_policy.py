"""The connector NetworkPolicies admit FlytePropeller as each Flyte distribution labels its pod, and nothing else.

The labels below are read from Flyte v1.16.8's Helm charts and the sandbox's
rendered manifest (put in our words; the charts are not part of this repository):

* flyte-core: FlytePropeller's pod carries the chart's ``flytepropeller.podLabels``:
  ``app.kubernetes.io/name: flytepropeller``, ``app.kubernetes.io/instance: <release>``,
  ``helm.sh/chart`` and ``app.kubernetes.io/managed-by``; flyteadmin, datacatalog and the
  scheduler carry their own ``name``.
* flyte-binary: one pod runs FlytePropeller with flyteadmin and datacatalog, labelled with the
  chart's selector labels: ``app.kubernetes.io/name: flyte-binary`` (the chart's name, or its
  ``nameOverride``), ``app.kubernetes.io/instance: <release>``,
  ``app.kubernetes.io/component: flyte-binary``.
* the sandbox (``flytectl demo start``): the flyte-binary chart with ``nameOverride: flyte-sandbox``,
  release ``flyte-sandbox``, so ``name: flyte-sandbox`` and ``component: flyte-binary``; the sandbox's
  buildkit and proxy pods carry ``name: flyte-sandbox`` too, with components ``buildkit`` and ``proxy``.

A peer with only a ``podSelector`` admits pods of the policy's own namespace (``flyte``, where all
three install FlytePropeller by default).
"""
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = [ROOT / "examples" / "k8s" / "connector.yaml", ROOT / "examples" / "k8s" / "flyte2-connector.yaml"]

PROPELLER_PODS = {
    "flyte-core": {"app.kubernetes.io/name": "flytepropeller", "app.kubernetes.io/instance": "flyte",
                   "helm.sh/chart": "flyte-core-v1.16.8", "app.kubernetes.io/managed-by": "Helm"},
    "flyte-binary": {"app.kubernetes.io/name": "flyte-binary", "app.kubernetes.io/instance": "flyte-backend",
                     "app.kubernetes.io/component": "flyte-binary"},
    "sandbox": {"app.kubernetes.io/name": "flyte-sandbox", "app.kubernetes.io/instance": "flyte-sandbox",
                "app.kubernetes.io/component": "flyte-binary"},
}
OTHER_PODS = {
    "flyte-core flyteadmin": {"app.kubernetes.io/name": "flyteadmin", "app.kubernetes.io/instance": "flyte"},
    "flyte-core datacatalog": {"app.kubernetes.io/name": "datacatalog", "app.kubernetes.io/instance": "flyte"},
    "sandbox buildkit": {"app.kubernetes.io/name": "flyte-sandbox", "app.kubernetes.io/instance": "flyte-sandbox",
                         "app.kubernetes.io/component": "buildkit"},
    "sandbox proxy": {"app.kubernetes.io/name": "flyte-sandbox", "app.kubernetes.io/instance": "flyte-sandbox",
                      "app.kubernetes.io/component": "proxy"},
    "a pod without labels": {},
    "any pod": {"app": "shell"},
}


def selects(selector: Dict, labels: Dict[str, str]) -> bool:
    """Whether a label selector (``matchLabels`` only: the manifests use nothing else) selects ``labels``."""
    assert set(selector) <= {"matchLabels"}, f"unexpected selector fields: {selector}"
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def grpc_peers(manifest: Path) -> List[Dict]:
    """The peers the manifest's NetworkPolicy admits to the Deployment's gRPC port."""
    docs = {d["kind"]: d for d in yaml.safe_load_all(manifest.read_text()) if d}
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    policy = docs["NetworkPolicy"]["spec"]
    assert selects(policy["podSelector"], docs["Deployment"]["spec"]["template"]["metadata"]["labels"])
    assert policy["policyTypes"] == ["Ingress"]
    rules = [rule for rule in policy["ingress"] if any(p["port"] == grpc_port for p in rule["ports"])]
    assert len(rules) == 1 and all("from" in rule for rule in policy["ingress"])  # no rule admits everyone
    peers = rules[0]["from"]
    assert all(set(peer) == {"podSelector"} for peer in peers)  # this namespace only; no ipBlock
    return peers


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
@pytest.mark.parametrize("distribution", sorted(PROPELLER_PODS))
def test_the_policy_admits_flytepropeller_of_each_distribution(manifest, distribution):
    assert any(selects(peer["podSelector"], PROPELLER_PODS[distribution]) for peer in grpc_peers(manifest))


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
@pytest.mark.parametrize("pod", sorted(OTHER_PODS))
def test_the_policy_admits_no_other_pod(manifest, pod):
    assert not any(selects(peer["podSelector"], OTHER_PODS[pod]) for peer in grpc_peers(manifest))


def test_the_selector_check_can_tell_a_match_from_a_miss():
    assert selects({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"})
    assert not selects({"matchLabels": {"a": "1", "c": "3"}}, {"a": "1", "b": "2"})
