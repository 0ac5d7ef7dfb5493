"""FlytePropeller's configuration as Flyte v1.16.8's released charts render it with the values the guide gives.

``helm template`` (Helm built from its Go module by tests/flyte_tier/build_peers.sh) renders flyte-binary with the
guide's ``configuration.inline``, flyte-core with its values and flyte-sandbox (the chart `flytectl demo start`
deploys; its charts from remote repositories left out) with the guide's ``~/.flyte/sandbox/config.yaml`` put
where flytectl puts it, as ``999-extra-config.yaml`` of the ``<release>-extra-config`` ConfigMap. The
configuration read is the one FlytePropeller's own Deployment reads: the files of the volume mounted at its
``--config`` glob, merged in file-name order as Flyte merges them (maps key by key, anything else replaced).
Each distribution must route the four ``ddlscale_*`` task types to the connector-service plugin at the shipped
connector Service's endpoint, with the settings of the guide's FlytePropeller block, and the propeller's
ClusterRole must grant what the endpoint's resolver needs.

The charts folder comes from ``$DDLSCALE_FLYTE_CHARTS`` (``.ci/run`` sets it); without it, or where Helm cannot
be built (no Go), the tests are skipped saying why. The guide's blocks are read by tests/flyte_tier/guide.py.
"""
from __future__ import annotations

import base64
import copy
import fnmatch
import os
import posixpath
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from flytekitplugins_ddlscale.connector import SERVED_TASK_TYPES
from tests.flyte_tier import peers
from tests.flyte_tier.guide import guide_text, guide_yaml

ROOT = Path(__file__).resolve().parents[2]
CONNECTOR_MANIFEST = ROOT / "examples" / "k8s" / "connector.yaml"
CHARTS_VARIABLE = "DDLSCALE_FLYTE_CHARTS"
RENDER_TIMEOUT = 120

pytestmark = [pytest.mark.flyte]


@pytest.fixture(scope="module")
def charts() -> Path:
    """The folder of Flyte v1.16.8's charts, from $DDLSCALE_FLYTE_CHARTS (skips, saying why, without it)."""
    value = os.environ.get(CHARTS_VARIABLE)
    if not value:
        pytest.skip(f"${CHARTS_VARIABLE} is not set: it names the folder of Flyte v1.16.8's charts "
                    "(flyte-binary, flyte-core, flyteconnector, flyte-sandbox); .ci/run sets it")
    folder = Path(value)
    missing = [name for name in ("flyte-binary", "flyte-core", "flyteconnector", "flyte-sandbox")
               if not (folder / name / "Chart.yaml").is_file()]
    if missing:
        pytest.skip(f"${CHARTS_VARIABLE}={value} lacks the charts {', '.join(missing)}")
    return folder


@pytest.fixture(scope="module")
def helm() -> str:
    """The path of Helm, built once per machine by tests/flyte_tier/build_peers.sh (skips, saying why, where it
    is not built)."""
    try:
        return str(peers.helm())
    except peers.MissingPeer as exc:
        pytest.skip(f"Helm is not here: {exc}")


def _chart_copy(charts: Path, name: str, dest: Path) -> Path:
    """A copy of chart ``name`` with its local (file://) dependencies unpacked into charts/, as `helm dependency
    build` would put them, and its dependencies on remote repositories left out (none of them renders FlytePropeller
    or its configuration)."""
    shutil.copytree(charts / name, dest, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    chart = yaml.safe_load((dest / "Chart.yaml").read_text())
    local = []
    for dependency in chart.get("dependencies") or []:
        repository = dependency.get("repository", "")
        if repository.startswith("file://"):
            _chart_copy(charts, posixpath.basename(repository[len("file://"):].rstrip("/")),
                        dest / "charts" / dependency["name"])
            local.append(dependency)
    chart["dependencies"] = local
    (dest / "Chart.yaml").write_text(yaml.safe_dump(chart, sort_keys=False))
    return dest


def render(helm: str, charts: Path, tmp: Path, chart: str, release: str, values: dict) -> list:
    """The objects `helm template` renders for ``chart`` with ``values`` (release ``release``, namespace flyte)."""
    folder = _chart_copy(charts, chart, tmp / chart)
    values_file = tmp / f"{chart}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    try:
        done = subprocess.run([helm, "template", release, str(folder), "--namespace", "flyte", "-f", str(values_file)],
                              capture_output=True, text=True, timeout=RENDER_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"helm template {chart} did not finish within {RENDER_TIMEOUT} s")
    assert done.returncode == 0, f"helm template {chart} failed: {done.stderr.strip()}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _object(objects: list, kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert found, f"no {kind} {name!r} rendered; rendered: {sorted((o['kind'], o['metadata']['name']) for o in objects)}"
    return found[0]


def _merge(base, override):
    """Flyte's merge of two configuration files: maps key by key, any other value replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    return copy.deepcopy(override)


def _source_files(objects: list, source: dict) -> dict:
    """The files a volume (or a projected volume's source) of a ConfigMap or Secret gives the container."""
    if "configMap" in source:
        return dict(_object(objects, "ConfigMap", source["configMap"]["name"]).get("data") or {})
    if "secret" in source:
        name = source["secret"].get("secretName") or source["secret"]["name"]
        secret = _object(objects, "Secret", name)
        files = {key: base64.b64decode(value).decode() for key, value in (secret.get("data") or {}).items()}
        files.update(secret.get("stringData") or {})
        return files
    return {}


def propeller_configuration(objects: list, deployment: str) -> dict:
    """The configuration the container of Deployment ``deployment`` started with ``--config <glob>`` reads: the
    files of the volume mounted at the glob's folder that match it, merged in file-name order."""
    spec = _object(objects, "Deployment", deployment)["spec"]["template"]["spec"]
    for container in spec["containers"]:
        words = list(container.get("command") or []) + list(container.get("args") or [])
        if "--config" in words:
            break
    else:
        raise AssertionError(f"no container of Deployment {deployment!r} is started with --config")
    pattern = words[words.index("--config") + 1]
    folder, glob = posixpath.split(pattern)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"].rstrip("/") == folder)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    sources = volume["projected"]["sources"] if "projected" in volume else [volume]
    files = {}
    for source in sources:
        files.update(_source_files(objects, source))
    configuration = {}
    for name in sorted(n for n in files if fnmatch.fnmatchcase(n, glob)):
        configuration = _merge(configuration, yaml.safe_load(files[name]) or {})
    return configuration


def _rules_of(objects: list, deployment: str) -> list:
    """The RBAC rules the Deployment's service account is granted by the rendered (Cluster)RoleBindings."""
    template = _object(objects, "Deployment", deployment)["spec"]["template"]
    account = (template["spec"].get("serviceAccountName"), "flyte")
    rules = []
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if any((s.get("name"), s.get("namespace")) == account for s in binding.get("subjects") or []):
            role = _object(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])
            rules.extend(role.get("rules") or [])
    return rules


def _grants(rules: list, group: str, resource: str, verb: str) -> bool:
    return any((group in r.get("apiGroups", []) or "*" in r.get("apiGroups", []))
               and (resource in r.get("resources", []) or "*" in r.get("resources", []))
               and (verb in r.get("verbs", []) or "*" in r.get("verbs", [])) for r in rules)


def connector_service() -> tuple:
    """The shipped connector Service (examples/k8s/connector.yaml): (name, namespace, port)."""
    service = next(d for d in yaml.safe_load_all(CONNECTOR_MANIFEST.read_text()) if d and d["kind"] == "Service")
    return service["metadata"]["name"], service["metadata"]["namespace"], service["spec"]["ports"][0]["port"]


def _service_of(endpoint: str) -> tuple:
    """The (name, namespace, port) of the Service a `k8s://` or `dns:///` endpoint names, and its resolver."""
    scheme, _, rest = endpoint.partition("://")
    host, _, port = rest.lstrip("/").rpartition(":")
    labels = host.split(".")
    if scheme == "dns" and labels[2:] not in ([], ["svc"], ["svc", "cluster", "local"]):
        raise AssertionError(f"{endpoint}: not the name of a Service")
    return (labels[0], labels[1] if len(labels) > 1 else None, int(port)), scheme


def assert_routes_ddlscale_to_the_connector(configuration: dict, rules: list) -> None:
    """FlytePropeller's configuration sends the four ddlscale task types to the connector-service plugin at the
    connector Service, with the guide's settings, through a resolver its RBAC allows."""
    plugins = configuration.get("tasks", {}).get("task-plugins", {})
    assert "connector-service" in plugins.get("enabled-plugins", []), plugins
    assert "container" in plugins.get("enabled-plugins", []), plugins  # the distribution's own list is kept
    for task_type in SERVED_TASK_TYPES:  # no default sends them elsewhere
        assert plugins.get("default-for-task-types", {}).get(task_type, "connector-service") == "connector-service"
    settings = configuration.get("plugins", {}).get("connector-service")
    assert settings, f"no plugins.connector-service in FlytePropeller's configuration: {sorted(configuration)}"
    endpoint = settings["defaultConnector"]["endpoint"]
    service, resolver = _service_of(endpoint)
    assert service == connector_service(), f"{endpoint} is not the connector Service {connector_service()}"
    assert sorted(settings["supportedTaskTypes"]) == sorted(SERVED_TASK_TYPES)
    assert settings == guide_yaml("connector.md", "propeller-connector-service")["plugins"]["connector-service"]
    if resolver == "k8s":  # FlytePropeller's Kubernetes resolver watches the Service's Endpoints
        for verb in ("get", "list", "watch"):
            assert _grants(rules, "", "endpoints", verb), f"{endpoint}: FlytePropeller may not {verb} endpoints"
    else:
        assert resolver == "dns", f"{endpoint}: a resolver this test does not know (k8s:// or dns:///)"


def test_flyte_binary_with_the_guides_inline_configuration(helm, charts, tmp_path):
    values = guide_yaml("connector.md", "flyte-binary-values")
    objects = render(helm, charts, tmp_path, "flyte-binary", "flyte-binary", values)
    configuration = propeller_configuration(objects, "flyte-binary")
    assert_routes_ddlscale_to_the_connector(configuration, _rules_of(objects, "flyte-binary"))


def test_flyte_core_with_the_guides_values(helm, charts, tmp_path):
    values = guide_yaml("connector.md", "flyte-core-values")
    objects = render(helm, charts, tmp_path, "flyte-core", "flyte", values)
    assert not any(o["metadata"]["name"] == "flyteconnector" for o in objects)  # no second connector deployed
    configuration = propeller_configuration(objects, "flytepropeller")
    assert_routes_ddlscale_to_the_connector(configuration, _rules_of(objects, "flytepropeller"))


def test_flyte_core_renders_only_the_configmap_keys_it_knows(helm, charts, tmp_path):
    """The chart fact the guide's flyte-core values are shaped by: a `configmap.*` key outside the propeller
    ConfigMap's fixed list (such as `connector_service`) is silently dropped."""
    settings = guide_yaml("connector.md", "propeller-connector-service")["plugins"]
    objects = render(helm, charts, tmp_path, "flyte-core", "flyte", {"configmap": {"connector_service": settings}})
    assert "connector-service" not in propeller_configuration(objects, "flytepropeller").get("plugins", {})


def test_the_sandbox_with_the_guides_extra_configuration(helm, charts, tmp_path):
    objects = render(helm, charts, tmp_path, "flyte-sandbox", "flyte-sandbox", {})
    # flytectl demo start replaces this ConfigMap with the user's ~/.flyte/sandbox/config.yaml as one file.
    extra = _object(objects, "ConfigMap", "flyte-sandbox-extra-config")
    extra["data"] = {"999-extra-config.yaml": guide_text("sandbox.md", "sandbox-extra-config")}
    configuration = propeller_configuration(objects, "flyte-sandbox")
    assert_routes_ddlscale_to_the_connector(configuration, _rules_of(objects, "flyte-sandbox"))
    assert configuration["tasks"]["task-plugins"]["enabled-plugins"] == [
        "container", "sidecar", "k8s-array", "connector-service", "echo"]  # the sandbox's own list, untouched
