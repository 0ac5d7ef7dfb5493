"""The connector images as the Dockerfile builds them and their manifests start them, without a container runtime.

For each connector target (``connector``: flytekit's ``pyflyte serve connector``,
examples/k8s/connector.yaml; ``flyte2-connector``: flyte's ``c0``,
examples/k8s/flyte2-connector.yaml) the module builds the target the way Docker would,
on this machine: a build context made from the repository minus
``.dockerignore``, then every ``COPY`` and ``RUN`` of the stages the target
needs, in order, with the image's paths translated to folders of the test
(``/src``, ``/dist``, ``/opt/venv``, the home folder, the base image's
Python, the uv cache the ``RUN --mount`` names). Only ``useradd`` is not
run (the test cannot create users); what it declares is checked against
``USER``, ``WORKDIR`` and the Deployment's ``securityContext``. So the
wheel is built from the context by the Dockerfile's own command, and the
virtual environment holds what the image would: the wheel with the
``connector`` extra under constraints.txt, not this source tree.

Then the Deployment's container runs as the manifest states it (command,
args, env read with a YAML parser; its ports translated to free ones), from
the working directory, with nothing of the test's environment. flytekit's:
gRPC health answers SERVING and ``ListAgents`` lists the four task types,
each once; a template the connector refuses fails in one attempt, at its
first GetTask, with one line that names the cause and carries no stack
frame (the connector itself loaded from the wheel). ``c0``:
``ListConnectors`` lists the four task types. The installed wheel's
``ddlscale`` command and data files work from outside the repository.
"""
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
import yaml

from flytekitplugins_ddlscale import WaitForCluster
from tests.port_support import free_ports
from tests.propeller_driver import refused_node
from tests.served_process import stop_process, wait_serving

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
EXAMPLES = ROOT / "examples" / "k8s"
TARGETS = {"connector": "connector.yaml", "flyte2-connector": "flyte2-connector.yaml"}
"""The Dockerfile's connector targets and the manifest that deploys each."""
NETWORK = re.compile(r"SSL|CERT|CA_BUNDLE|PROXY|^UV_|^PIP_", re.I)


def _uv_version(uv: str) -> Optional[str]:
    """The version ``uv --version`` prints (``0.13.8``), or None where it does not run."""
    try:
        done = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    words = done.stdout.split()
    return words[1] if done.returncode == 0 and len(words) > 1 else None


def dockerfile_uv() -> Tuple[Optional[str], str]:
    """The uv the Dockerfile pins (its ``COPY --from=ghcr.io/astral-sh/uv:<version>``) and what was found: the
    one the README's install puts beside this Python (pinned by constraints.txt), else the first of that version
    on PATH; (None, the versions found) where no uv here is that version."""
    pinned = re.search(r"ghcr\.io/astral-sh/uv:(\S+)", DOCKERFILE.read_text()).group(1)
    beside = Path(sys.executable).parent / "uv"
    candidates = [str(beside)] if beside.is_file() else []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which("uv", path=folder) if folder else None
        if found and found not in candidates:
            candidates.append(found)
    seen = []
    for candidate in candidates:
        version = _uv_version(candidate)
        if version == pinned:
            return candidate, f"uv {pinned}"
        seen.append(f"{candidate} is {version or 'not runnable'}")
    return None, f"the Dockerfile pins uv {pinned}; no uv here is that version ({'; '.join(seen) or 'none found'})"


UV, UV_FOUND = dockerfile_uv()
"""The uv the steps run (see :func:`dockerfile_uv`; the test command runs ``.venv/bin/python`` without the
venv's bin on PATH, and a user's own uv on PATH may be another version), or None and why."""
TASK_TYPES = {"ddlscale_scale", "ddlscale_wait", "ddlscale_restore", "ddlscale_restart_head"}

pytestmark = pytest.mark.slow

UNSERVED_WAIT = WaitForCluster("image_probe", cluster="dask/x", backend="local", timeout=60)
"""A node the Deployment does not serve (the local backend is served only when listed)."""


@dataclass
class Stage:
    base: str
    name: str
    steps: List[Tuple[str, str]] = field(default_factory=list)  # (instruction, rest of the line)


def dockerfile_stages(text: str) -> List[Stage]:
    """The Dockerfile's stages, each with its instructions (continuation lines joined, comments dropped)."""
    stages: List[Stage] = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            words = rest.split()
            stages.append(Stage(base=words[0], name=words[2] if len(words) > 2 else str(len(stages))))
        else:
            stages[-1].steps.append((instruction.upper(), rest.strip()))
    return stages


def needed_stages(stages: List[Stage], target: str) -> List[Stage]:
    """The stages ``target`` builds on (its bases and the stages it copies from), in file order."""
    by_name = {stage.name: stage for stage in stages}
    wanted, todo = set(), [target]
    while todo:
        stage = by_name[todo.pop()]
        if stage.name in wanted:
            continue
        wanted.add(stage.name)
        if stage.base in by_name:
            todo.append(stage.base)
        todo += [m.group(1) for kind, rest in stage.steps if kind == "COPY"
                 for m in [re.match(r"--from=(\S+)", rest)] if m and m.group(1) in by_name]
    return [stage for stage in stages if stage.name in wanted]


def ignored(relative: str, patterns: List[str]) -> bool:
    """Whether ``.dockerignore``'s ``patterns`` leave ``relative`` (a posix path in the context) out."""
    return any(fnmatch.fnmatch(relative, p) or (p.startswith("**/") and fnmatch.fnmatch(relative, p[3:]))
               for p in patterns)


def build_context(destination: Path) -> Path:
    """The repository as Docker sends it to the build: everything ``.dockerignore`` does not leave out."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

    def skip(folder: str, names: List[str]) -> List[str]:
        relative = Path(folder).relative_to(ROOT)
        return [n for n in names if ignored((relative / n).as_posix(), patterns)]

    shutil.copytree(ROOT, destination, ignore=skip)
    return destination


@dataclass
class BuiltImage:
    target: str
    manifest: Path
    venv: Path
    workdir: Path
    user: str
    useradd: List[str]
    context: Path


def _uv_cache() -> str:
    return subprocess.run([UV, "cache", "dir"], capture_output=True, text=True, check=True).stdout.strip()


def _python_of(base: str) -> Optional[str]:
    """A local interpreter of the base image's Python version (``python:3.11-slim`` -> 3.11), if uv finds one."""
    version = re.match(r"python:(\d+\.\d+)", base)
    found = subprocess.run([UV, "python", "find", "--no-python-downloads", version.group(1)],
                           capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


@pytest.fixture(scope="module", params=sorted(TARGETS))
def image(request, tmp_path_factory) -> Iterator[BuiltImage]:
    """A connector target's steps run on this machine (see the module's docstring)."""
    target = request.param
    if UV is None:
        pytest.skip(f"the Dockerfile's build and install steps are uv commands: {UV_FOUND}")
    top = tmp_path_factory.mktemp("image")
    stages = needed_stages(dockerfile_stages(DOCKERFILE.read_text()), target)
    by_name = {stage.name: stage for stage in stages}
    base = target
    while base in by_name:  # the image the target's chain of stages starts from
        base = by_name[base].base
    python = _python_of(base)
    if python is None:
        pytest.skip(f"no local Python of the base image {base} (uv python find)")
    context = top / "context"
    paths = {"/src": str(context), "/dist": str(top / "dist"), "/opt/venv": str(top / "venv"),
             "/root/.cache/uv": _uv_cache(), "/home/flyte": str(top / "home")}
    python_path = re.search(r"--python (/usr/local/bin/python\S*)", DOCKERFILE.read_text()).group(1)
    paths[python_path] = python

    def translate(text: str) -> str:
        for image_path in sorted(paths, key=len, reverse=True):
            text = re.sub(rf"(?<![\w/.-]){re.escape(image_path)}(?=[/\s\"']|$)", paths[image_path], text)
        return text

    build_context(context)
    # The build reaches the package index as this machine does (its CA certificates, proxies, index settings).
    env = {key: value for key, value in os.environ.items() if NETWORK.search(key)}
    # The base image's /usr/local/bin: the pinned uv and the base image's Python, nothing else of this machine's.
    local_bin = top / "usr-local-bin"
    local_bin.mkdir()
    for name, where in {"uv": UV, "python3": python, re.search(r"python[\d.]*$", python_path).group(0): python}.items():
        (local_bin / name).symlink_to(where)
    env.update(PATH=f"{top / 'venv' / 'bin'}:{local_bin}:/usr/bin:/bin",
               HOME=str(top / "root"), UV_CACHE_DIR=_uv_cache())
    user, workdir, useradd = "", "", []
    for stage in stages:
        for kind, rest in stage.steps:
            if kind == "COPY":
                source, destination = rest.split()[-2:]
                origin = re.match(r"--from=(\S+)", rest)
                if origin and origin.group(1).startswith("ghcr.io/astral-sh/uv:"):
                    version = subprocess.run([UV, "--version"], capture_output=True, text=True).stdout.split()[1]
                    assert origin.group(1).rsplit(":", 1)[1] == version, "the Dockerfile's uv is not the uv here"
                    continue
                source_path = Path(translate(source)) if origin else context / source
                target_path = Path(translate(destination))
                if source_path == target_path:
                    continue  # the stage's /dist is the test's one /dist
                if source_path.is_dir():
                    shutil.copytree(source_path, target_path, dirs_exist_ok=True)
                else:
                    target_path.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(source_path, target_path)
            elif kind == "RUN":
                command = re.sub(r"^(--\S+\s+)+", "", rest)
                if command.startswith("useradd "):
                    useradd = shlex.split(command)
                    continue
                done = subprocess.run(["bash", "-ec", translate(command)], env=env, capture_output=True, text=True,
                                      timeout=600)
                assert done.returncode == 0, f"RUN {command}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
            elif kind == "USER":
                user = rest
            elif kind == "WORKDIR":
                workdir = rest
    home = Path(translate(workdir))
    home.mkdir(parents=True, exist_ok=True)
    yield BuiltImage(target=target, manifest=EXAMPLES / TARGETS[target], venv=top / "venv", workdir=home, user=user,
                     useradd=useradd, context=context)


def image_process(stages: List[Stage], target: str) -> Tuple[Optional[List[str]], Optional[List[str]]]:
    """The ``ENTRYPOINT`` and ``CMD`` (exec form) the image of ``target`` carries: its own, else its base
    stage's (None where neither this file nor a stage of it sets one)."""
    by_name = {stage.name: stage for stage in stages}
    chain, name = [], target
    while name in by_name:
        chain.insert(0, by_name[name])
        name = by_name[name].base
    entrypoint = cmd = None
    for stage in chain:
        for kind, rest in stage.steps:
            if kind == "ENTRYPOINT":
                entrypoint, cmd = json.loads(rest), None  # a new ENTRYPOINT clears the base's CMD
            elif kind == "CMD":
                cmd = json.loads(rest)
    return entrypoint, cmd


def kubernetes_argv(container: Dict, entrypoint: Optional[List[str]], cmd: Optional[List[str]]) -> List[str]:
    """What Kubernetes runs for ``container`` of an image with ``entrypoint`` and ``cmd``: ``command`` replaces
    the ENTRYPOINT and drops the CMD; ``args`` replace the CMD."""
    if "command" in container:
        return list(container["command"]) + list(container.get("args", []))
    return list(entrypoint or []) + list(container["args"] if "args" in container else cmd or [])


def _container(manifest: Path) -> Dict:
    deployment = next(d for d in yaml.safe_load_all(manifest.read_text()) if d and d["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _run_env(image: BuiltImage, container: Dict) -> Dict[str, str]:
    """The container's environment as the manifest states it, on the image's PATH and home (nothing of the test's)."""
    env = {"PATH": f"{image.venv / 'bin'}:/usr/bin:/bin", "HOME": str(image.workdir), "TMPDIR": tempfile.gettempdir()}
    env.update({item["name"]: item["value"] for item in container.get("env", [])})
    return env


def _flytekit_connector_serves(channel) -> None:
    """gRPC health SERVING, the four task types in ListAgents once each, and an unserved template refused in one
    attempt, FAILED at its first GetTask with one line and no stack frame (the connector itself loaded from the
    wheel at that first call)."""
    from flyteidl.admin import agent_pb2
    from flyteidl.service.agent_pb2_grpc import AgentMetadataServiceStub
    from flytekit.configuration import Image, ImageConfig, SerializationSettings
    from flytekit.tools.translator import get_serializable
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    agents = AgentMetadataServiceStub(channel).ListAgents(agent_pb2.ListAgentsRequest(), timeout=30).agents
    listed = [c.name for a in agents for c in a.supported_task_categories if c.name.startswith("ddlscale_")]
    assert sorted(listed) == sorted(TASK_TYPES)

    settings = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="i", tag="1")))
    template = get_serializable(OrderedDict(), settings, UNSERVED_WAIT).template
    line = refused_node(channel, template.to_flyte_idl(), None, template.type)
    assert line.startswith("[not_served]") and "local" in line, line


def _flyte2_connector_serves(channel) -> None:
    """flyte's c0 lists the four task types under the ddlscale connector (it has no gRPC health service)."""
    from flyteidl2.connector import service_pb2_grpc
    from flyteidl2.connector.connector_pb2 import ListConnectorsRequest

    listed = service_pb2_grpc.ConnectorMetadataServiceStub(channel).ListConnectors(ListConnectorsRequest(), timeout=30)
    (ours,) = [c for c in listed.connectors if c.name == "ddlscale connector"]
    assert sorted(c.name for c in ours.supported_task_categories) == sorted(TASK_TYPES)


SERVED_BY = {"connector": _flytekit_connector_serves, "flyte2-connector": _flyte2_connector_serves}
"""What each target's server must answer once it is up."""


def test_the_image_runs_as_the_user_it_creates_in_a_home_it_can_write(image):
    words = image.useradd
    options = {word: words[i + 1] for i, word in enumerate(words[:-1]) if word in ("--uid", "--home-dir")}
    assert "--create-home" in image.useradd
    uid = options["--uid"]
    assert image.user.split(":")[0] == uid
    security = _container(image.manifest)["securityContext"]
    assert security["runAsNonRoot"] is True and str(security["runAsUser"]) == uid
    # The working directory is the created user's home, not /root (mode 700 on Debian-based images).
    assert options["--home-dir"] == re.search(r"^WORKDIR (\S+)", DOCKERFILE.read_text(), re.M).group(1)
    assert not (image.context / ".venv").exists() and not (image.context / ".git").exists()
    assert (image.context / "setup.py").exists() and not list(image.context.rglob("__pycache__"))


def test_the_wheel_installs_the_package_its_data_files_and_the_ddlscale_command(image):
    python = str(image.venv / "bin" / "python")
    env = _run_env(image, {})
    where = subprocess.run(
        [python, "-c", "import importlib.resources as r, flytekitplugins_ddlscale as p; print(p.__file__); "
                       "print(r.files('flytekitplugins_ddlscale').joinpath('data/local_tiers.yaml').read_text()[:400])"],
        cwd=image.workdir, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    installed = Path(where.stdout.splitlines()[0])
    assert image.venv in installed.parents and ROOT not in installed.parents
    assert "tiers" in where.stdout  # the data file shipped in the wheel
    helped = subprocess.run([str(image.venv / "bin" / "ddlscale"), "--help"], cwd=image.workdir, env=env,
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "local" in helped.stdout, helped.stderr
    # The local backend's tiers come from the wheel's data file.
    tiers = subprocess.run(
        [python, "-c", "from flytekitplugins_ddlscale.backends.local._tiers import load_catalog; "
                       "print(len(load_catalog().tiers()))"],
        cwd=image.workdir, env=env, capture_output=True, text=True, timeout=120)
    assert tiers.returncode == 0 and int(tiers.stdout.strip()) > 0, tiers.stderr


def test_the_deployment_as_the_manifest_states_it_serves_the_four_task_types(image):
    import grpc

    container = _container(image.manifest)
    # The pod's network is its own: the manifest's container ports become free ports of this machine.
    ports = dict(zip((str(p["containerPort"]) for p in container["ports"]), map(str, free_ports(len(container["ports"])))))
    process = kubernetes_argv(container, *image_process(dockerfile_stages(DOCKERFILE.read_text()), image.target))
    argv = [ports.get(word, word) for word in process]
    env = _run_env(image, container)
    executable = shutil.which(argv[0], path=env["PATH"])
    assert executable and image.venv in Path(executable).parents
    grpc_port = ports[str(next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc"))]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([executable, *argv[1:]], cwd=image.workdir, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        try:
            exited = wait_serving(channel, proc, log, 90.0, "the connector")
            if exited is not None:
                pytest.fail(f"the connector did not start: {exited}")
            SERVED_BY[image.target](channel)
        finally:
            channel.close()
            stop_process(proc, 20)


MANIFEST_PROCESS = {"connector": ["pyflyte", "serve", "connector"], "flyte2-connector": ["c0"]}
"""The server each connector target's image runs by itself (its CMD)."""


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_each_connector_image_runs_its_server_by_itself_as_its_manifest_runs_it(target):
    stages = dockerfile_stages(DOCKERFILE.read_text())
    entrypoint, cmd = image_process(stages, target)
    assert entrypoint is None and cmd == MANIFEST_PROCESS[target]
    container = _container(EXAMPLES / TARGETS[target])
    # The manifest names the same program (so a pod and `docker run` start one server) and only adds the ports.
    assert container["command"] == cmd
    argv = kubernetes_argv(container, entrypoint, cmd)
    options = dict(zip(argv[len(cmd)::2], argv[len(cmd) + 1::2]))
    ports = {p["name"]: str(p["containerPort"]) for p in container["ports"]}
    assert options == {"--port": ports["grpc"], "--prometheus_port": ports["metrics"]}
    # Without the manifest's args the server listens where the manifest's Service and probes look.
    server = {"connector": "flytekit.clis.sdk_in_container.serve:connector", "flyte2-connector": "flyte._bin.connect:main"}
    module, command = server[target].split(":")
    probe = (f"import json; from {module} import {command} as c; "
             "print(json.dumps({p.name: str(p.default) for p in c.params}))")
    read = subprocess.run([sys.executable, "-c", probe], cwd=tempfile.gettempdir(), capture_output=True, text=True,
                          timeout=120)
    assert read.returncode == 0, read.stderr
    defaults = json.loads(read.stdout.strip().splitlines()[-1])
    assert (defaults["port"], defaults["prometheus_port"]) == (ports["grpc"], ports["metrics"])


def test_the_default_target_is_the_flytekit_connector_the_guides_build_and_the_flow_image_has_no_entrypoint():
    stages = dockerfile_stages(DOCKERFILE.read_text())
    assert stages[-1].name == "connector"  # what `docker build .` builds
    # Every `docker build` the pages give tags the image that the manifest of the target it builds deploys.
    images = {target: _container(EXAMPLES / manifest)["image"] for target, manifest in TARGETS.items()}
    builds = [line for page in ("connector.md", "sandbox.md") for line in (ROOT / "docs" / page).read_text().splitlines()
              if line.lstrip().startswith("docker build")]
    defaults = [line for line in builds if "--target" not in line]
    assert defaults and all(f"-t {images['connector']} " in line for line in defaults), defaults
    for line in builds:
        target = re.search(r"--target (\S+)", line)
        if target and target.group(1) in images:
            assert f"-t {images[target.group(1)]} " in line, line
    # Flyte starts a task pod with the task's command as the container's args and no command of its own: the
    # flow image must have no ENTRYPOINT, so those args are the process (a CMD would be replaced by them).
    from flytekit.configuration import Image, ImageConfig, SerializationSettings
    from flytekit.tools.translator import get_serializable
    from tests.flyte_apps import nodes

    settings = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="i", tag="1")))
    task_container = get_serializable(OrderedDict(), settings, nodes.count_workers).template.container
    entrypoint, cmd = image_process(stages, "flow")
    assert not task_container.command and task_container.args[0].startswith("pyflyte-")
    assert kubernetes_argv({"args": list(task_container.args)}, entrypoint, cmd) == list(task_container.args)


def test_the_steps_run_the_uv_the_dockerfile_pins_whatever_uv_comes_first_on_path(tmp_path):
    pinned = re.search(r"ghcr\.io/astral-sh/uv:(\S+)", DOCKERFILE.read_text()).group(1)
    if UV is None:
        pytest.skip(UV_FOUND)
    fake = tmp_path / "uv"
    fake.write_text("#!/bin/sh\necho 'uv 0.13.10 (a user's own)'\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=os.pathsep.join([str(tmp_path), os.environ.get("PATH", "")]))
    probe = "from tests.test_connector_image import UV; print(UV)"
    chosen = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert chosen.returncode == 0, chosen.stderr
    uv = chosen.stdout.strip().splitlines()[-1]
    assert uv != str(fake) and _uv_version(uv) == pinned
