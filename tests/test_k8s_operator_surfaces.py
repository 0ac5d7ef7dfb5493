"""KubeRay and Dask-operator clusters through every surface: a ScaleCluster node (flytekit local
execution), ``ddlscale`` (a real subprocess), a phase, and a printed remedy command, all on the
Kubernetes backend against the test server, chosen through the environment."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flytekitplugins_ddlscale import ClusterRef, ScalingTimeoutError
from flytekitplugins_ddlscale.backends import get_backend
from flytekitplugins_ddlscale.phase import cluster_phase
from flytekitplugins_ddlscale.tasks import ScaleCluster
from tests.contract_support import run_shell, write_kubeconfig
from tests.servers.k8s_server import K8sTestServer
from tests.servers.ray_dashboard import RayDashboardServer

RAY = "rayclusters.ray.io"
GROUPS = "daskworkergroups.kubernetes.dask.org"
DDLSCALE = str(Path(sys.executable).parent / "ddlscale")


@pytest.fixture
def k8s_env(tmp_path, monkeypatch):
    """The test server, chosen by ``$DDLSCALE_BACKEND`` and ``$KUBECONFIG`` as in a task pod."""
    with K8sTestServer(ready_delay=0.02) as server:
        config = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        monkeypatch.setenv("DDLSCALE_BACKEND", "kubernetes")
        monkeypatch.setenv("KUBECONFIG", str(config))
        monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "state"))
        for name in ("CLUSTER_SCALER_BASE_URL", "DOMINO_RUN_ID", "DOMINO_API_PROXY"):
            monkeypatch.delenv(name, raising=False)
        yield server


def _group_replicas(server, name):
    obj = server.get_resource(RAY, "r1")
    return next(g for g in obj["spec"]["workerGroupSpecs"] if g["groupName"] == name)["replicas"]


def test_scale_node_on_a_kuberay_group_waits_for_pods_and_ray(k8s_env, monkeypatch):
    k8s_env.add_kuberay("r1", groups=[{"groupName": "cpu", "replicas": 1}, {"groupName": "gpu", "replicas": 0}])
    with RayDashboardServer() as head:
        monkeypatch.setenv("DDLSCALE_RAY_URL", head.url)
        head.join_after(0.5, 1.0, 1.5)
        outcome = ScaleCluster("up_gpu", cluster="kuberay/r1@gpu", replicas=3, timeout=60)()
        assert head.alive_count() == 3 and time.monotonic() >= head.last_join()
    assert outcome.cluster == "domino-compute/kuberay/r1@gpu" and outcome.backend == "kubernetes"
    assert (outcome.requested, outcome.effective, outcome.ready_workers) == (3, 3, 3)
    assert "3 worker pods Ready (kubernetes)" in outcome.readiness and "3 workers registered with" in outcome.readiness
    assert _group_replicas(k8s_env, "gpu") == 3 and _group_replicas(k8s_env, "cpu") == 1


def test_cli_scales_and_restores_a_dask_operator_group(k8s_env):
    k8s_env.add_dask_operator("d1", replicas=1, groups={"highmem": 1})
    common = ["--backend", "kubernetes", "--kind", "dask-operator", "--name", "d1", "--group", "highmem"]
    env = dict(os.environ)
    done = subprocess.run([DDLSCALE, "scale", *common, "--replicas", "3", "--json", "--no-framework-check",
                           "--timeout", "60"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["final"]["ready_workers"] == 3 and result["cluster"].endswith("dask-operator/d1@highmem")
    assert k8s_env.get_resource(GROUPS, "d1-highmem")["spec"]["worker"]["replicas"] == 3
    assert k8s_env.get_resource(GROUPS, "d1-default")["spec"]["worker"]["replicas"] == 1
    back = subprocess.run([DDLSCALE, "restore", *common, "--json", "--timeout", "60"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert back.returncode == 0, back.stderr
    assert k8s_env.get_resource(GROUPS, "d1-highmem")["spec"]["worker"]["replicas"] == 1


def test_a_printed_remedy_names_the_group_and_restores_it(k8s_env):
    k8s_env.add_kuberay("r1", groups=[{"groupName": "cpu", "replicas": 1}, {"groupName": "gpu", "replicas": 1}])
    ref = ClusterRef("kuberay", "r1", "domino-compute", "gpu")
    k8s_env.set_ready_delay(60, "r1")
    with get_backend() as backend:
        with pytest.raises(ScalingTimeoutError) as caught:
            backend.scale(ref, 3, timeout=0.5)
    error = caught.value
    assert "--group gpu" in error.remedy_command and 'group="gpu"' in error.remedy_call
    assert "spec.workerGroupSpecs[groupName=gpu].replicas=3 left in place" in str(error)
    ran = run_shell(error.remedy_command, KUBECONFIG=os.environ["KUBECONFIG"])
    assert ran.returncode == 0, ran.stderr
    assert _group_replicas(k8s_env, "gpu") == 1 and _group_replicas(k8s_env, "cpu") == 1
    # The one Ready worker stayed; the pending ones were the ones named for deletion.
    ready = k8s_env.select_pods(ready=True, **{"ray.io/cluster": "r1", "ray.io/group": "gpu"})
    assert len(ready) == 1


def test_phase_holds_a_dask_operator_cluster_and_exports_the_scheduler(k8s_env):
    k8s_env.add_dask_operator("d1", replicas=1)
    with cluster_phase("dask-operator/d1", 3, timeout=60, framework_ready=False, reassert_interval=None,
                       deck=False) as phase:
        assert k8s_env.get_resource(GROUPS, "d1-default")["spec"]["worker"]["replicas"] == 3
        assert os.environ["DASK_SCHEDULER_SERVICE_HOST"] == "d1-scheduler.domino-compute.svc"
        assert os.environ["DASK_SCHEDULER_SERVICE_PORT"] == "8786"
        assert phase.framework_check
    assert "DASK_SCHEDULER_SERVICE_HOST" not in os.environ
    assert k8s_env.get_resource(GROUPS, "d1-default")["spec"]["worker"]["replicas"] == 1
    notes = k8s_env.get_resource(GROUPS, "d1-default")["metadata"].get("annotations") or {}
    assert not [k for k in notes if k.startswith("ddlscale")]


def test_sandbox_example_flow_serializes_for_the_operator_cluster(monkeypatch):
    """examples/k8s_operator_flow.py (docs/sandbox.md) registers: scale node, stage, restore node."""
    from collections import OrderedDict

    from flytekit.configuration import Image, ImageConfig, SerializationSettings
    from flytekit.core.base_task import PythonTask
    from flytekit.tools.translator import get_serializable

    settings = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    monkeypatch.setenv("DDLSCALE_EXAMPLE_CLUSTER", "ray-clusters/kuberay/shared-ray@workers")
    sys.modules.pop("k8s_operator_flow", None)
    module = __import__("k8s_operator_flow")
    flow = get_serializable(OrderedDict(), settings, module.operator_flow).template
    tasks = {t.name: t for t in vars(module).values() if isinstance(t, PythonTask)}
    types = []
    for node in flow.nodes:
        template = get_serializable(OrderedDict(), settings, tasks[node.task_node.reference_id.name]).template
        types.append(template.type)
        if template.type.startswith("ddlscale"):
            assert template.custom["cluster"] == "ray-clusters/kuberay/shared-ray@workers"
            assert template.custom["backend"] == "kubernetes"
    assert sorted(types) == sorted(["ddlscale_scale", "python-task", "ddlscale_restore"])
    sys.modules.pop("k8s_operator_flow", None)
