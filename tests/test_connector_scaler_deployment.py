"""The connector on the scaler backend as examples/k8s/scaler-connector.yaml deploys it, run as a stock
`pyflyte serve connector` against the scaler test server: its token file (a mounted Secret) rotated under the
running process is used from the next request on, its metrics port serves flytekit's and the plugin's metrics, and
its baselines, on the volume the manifest mounts, survive a restart of the process between a ScaleCluster and its
RestoreCluster."""
import os
import urllib.request
from pathlib import Path

import pytest
import yaml
from flyteidl.core.execution_pb2 import TaskExecution
from flyteidl.service.agent_pb2_grpc import AsyncAgentServiceStub

from flytekitplugins_ddlscale import ClusterRef, UnauthorizedError
from flytekitplugins_ddlscale._core import settings
from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend
from flytekitplugins_ddlscale.tasks import RestoreOutcome, ScaleCluster, ScaleOutcome
from tests.flyte_support import SCALER_ENV
from tests.servers.scaler_server import DEFAULT_API_KEY, DEFAULT_TOKEN, DEFAULT_USER, ScalerTestServer
from tests.test_connector import RAY, ray_restore, ray_scale
from tests.test_connector_service import create, get_until_done, output, serving, serving_process

MANIFEST = Path(__file__).resolve().parent.parent / "examples" / "k8s" / "scaler-connector.yaml"
ray_scale_two = ScaleCluster("ray_scale_two", cluster=RAY, replicas=2, timeout=60)


def _deployment():
    return next(d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "Deployment")


def _volume_paths(tmp_path):
    """Each path the container mounts, as a folder of ``tmp_path``: {mount path: (local folder, volume)}."""
    pod = _deployment()["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: (tmp_path / m["name"], volumes[m["name"]]) for m in pod["containers"][0]["volumeMounts"]}


def _local(path, mounts):
    """``path`` of the container as the local path under the folder standing in for its volume."""
    mount = next(m for m in mounts if path.startswith(m + "/"))
    return mounts[mount][0] / path[len(mount) + 1:]


def kubelet_writes(folder, token, version):
    """Write ``token`` (as it is: no newline added) as the kubelet updates a mounted Secret or a projected token:
    a new timestamped folder, the ``..data`` link swapped to it in one rename, ``token`` a link through ``..data``."""
    data = folder / f"..{version}"
    data.mkdir(parents=True)
    (data / "token").write_text(token)
    (folder / "..data_tmp").symlink_to(data.name)
    os.replace(folder / "..data_tmp", folder / "..data")
    if not (folder / "token").is_symlink():
        (folder / "token").symlink_to("..data/token")


def _manifest_env(server, mounts):
    """The container's environment as the manifest states it (its paths on the stand-in volumes, the service's
    URL the test server's), over this process's minus any scaler or ddlscale setting."""
    env = {k: v for k, v in os.environ.items()
           if k not in SCALER_ENV and k != "DOMINO_TOKEN_FILE" and not k.startswith("DDLSCALE_")}
    stated = {e["name"]: e["value"] for e in _deployment()["spec"]["template"]["spec"]["containers"][0]["env"]}
    for name in ("DDLSCALE_STATE_DIR", "DOMINO_TOKEN_FILE"):
        stated[name] = str(_local(stated[name], mounts))
    stated["CLUSTER_SCALER_BASE_URL"] = server.url
    return dict(env, **stated)


def _bearers(server):
    return {r.headers.get("authorization") for r in server.requests if "/ddl_cluster_scaler/" in r.path}


def test_the_manifest_keeps_baselines_on_a_claimed_volume_and_recreates_its_one_pod(tmp_path):
    deployment = _deployment()
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    mounts = _volume_paths(tmp_path)
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    state_mount = next(m for m in mounts if env["DDLSCALE_STATE_DIR"]["value"].startswith(m + "/"))
    assert "persistentVolumeClaim" in mounts[state_mount][1]
    # The kubelet's recursive fsGroup change (the default, Always) would make the state folder group-writable at
    # each start, which the connector refuses; OnRootMismatch leaves the volume's contents as they are.
    assert deployment["spec"]["template"]["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    token_mount = next(m for m in mounts if env["DOMINO_TOKEN_FILE"]["value"].startswith(m + "/"))
    assert "secret" in mounts[token_mount][1]


@pytest.mark.parametrize("manifest", sorted(p.name for p in MANIFEST.parent.glob("*.yaml")))
def test_no_manifest_writes_a_secret_into_a_pods_environment(manifest):
    """Every setting of kind secret a pod gets comes from a Secret (``valueFrom``), never as a value."""
    secret_settings = {s.name for s in settings.SETTINGS if s.kind == "secret"}
    assert {"DOMINO_API_KEY", "DOMINO_TOKEN"} <= secret_settings
    for document in yaml.safe_load_all((MANIFEST.parent / manifest).read_text()):
        pod = (document or {}).get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            written = {e["name"] for e in container.get("env", []) if "value" in e} & secret_settings
            assert not written, f"{manifest}: {written} written into the manifest"


@pytest.mark.slow
def test_a_rotated_token_is_used_and_a_restart_between_scale_and_restore_keeps_the_baseline(tmp_path):
    old, new = "token-before-rotation-1", "token-after-rotation-2"
    mounts = _volume_paths(tmp_path)
    with ScalerTestServer(pod_ready_delay=0.2) as server:
        server.add_cluster("ray", "conn-ray", replicas=1, max_replicas=4, min_replicas=None)
        server.add_user(DEFAULT_USER, token=old)
        server.add_user(DEFAULT_USER, token=new)
        env = _manifest_env(server, mounts)
        secret = Path(env["DOMINO_TOKEN_FILE"]).parent
        kubelet_writes(secret, old + "\n", 1)  # as `kubectl create secret --from-file` keeps a file's newline
        with serving_process(env) as (channel, process):
            stub = AsyncAgentServiceStub(channel)
            scaled = get_until_done(stub, "ddlscale_scale", create(stub, ray_scale))[-1]
            assert scaled.resource.phase == TaskExecution.SUCCEEDED, scaled.resource.message
            assert output(scaled, ScaleOutcome).workers == 3 and _bearers(server) == {f"Bearer {old}"}
            # The metrics port the manifest starts it with (its Service's `metrics` port) answers Prometheus.
            metrics = process.args[process.args.index("--prometheus_port") + 1]
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as answer:
                exposition = answer.read().decode()
            assert "ddlscale_connector_creates_total{" in exposition and "flyte_connector_" in exposition

            kubelet_writes(secret, new + "\n", 2)
            server.add_user("nobody", token=old)  # the old token revoked: it now names a user owning nothing
            server.clear_requests()
            scaled = get_until_done(stub, "ddlscale_scale", create(stub, ray_scale_two))[-1]
            assert scaled.resource.phase == TaskExecution.SUCCEEDED, scaled.resource.message
            assert output(scaled, ScaleOutcome).workers == 2 and _bearers(server) == {f"Bearer {new}"}

        # A connector whose state folder is not the volume (a pod without it) has no baseline to restore.
        with serving(dict(env, DDLSCALE_STATE_DIR=str(tmp_path / "pod-own-files" / "state"))) as channel:
            stub = AsyncAgentServiceStub(channel)
            reply = get_until_done(stub, "ddlscale_restore", create(stub, ray_restore))[-1]
            assert reply.resource.phase == TaskExecution.FAILED
            assert "no baseline is recorded for ray/conn-ray" in reply.resource.message
            assert server.cluster_object("ray", "conn-ray")["spec"]["worker"]["replicas"] == 2

        # The connector started again on the volume restores the baseline the first scale recorded.
        with serving(env) as channel:
            stub = AsyncAgentServiceStub(channel)
            reply = get_until_done(stub, "ddlscale_restore", create(stub, ray_restore))[-1]
            assert reply.resource.phase == TaskExecution.SUCCEEDED, reply.resource.message
            restored = output(reply, RestoreOutcome)
            assert (restored.restored, restored.previous_workers, restored.workers) == ("baseline", 2, 1)


def test_the_token_file_comes_after_domino_token_and_before_the_api_key_and_an_unreadable_one_is_one_line(
        scaler_server, tmp_path):
    scaler_server.add_cluster("ray", "ray-run1")
    scaler_server.add_user(DEFAULT_USER, token="test-token-first")
    token_file = tmp_path / "token"
    token_file.write_text(DEFAULT_TOKEN + "\n")
    for env, sent in (({"DOMINO_TOKEN": "test-token-first", "DOMINO_TOKEN_FILE": str(token_file)}, "test-token-first"),
                      ({"DOMINO_TOKEN_FILE": str(token_file), "DOMINO_API_KEY": DEFAULT_API_KEY}, DEFAULT_TOKEN)):
        scaler_server.clear_requests()
        with ScalerServiceBackend(scaler_server.url, state_dir=tmp_path / "state", env=env) as backend:
            backend.get_state(ClusterRef("ray", "ray-run1"))
        assert _bearers(scaler_server) == {f"Bearer {sent}"}
    scaler_server.clear_requests()
    missing = tmp_path / "absent"
    with pytest.raises(UnauthorizedError) as refused:
        with ScalerServiceBackend(scaler_server.url, state_dir=tmp_path / "state",
                                  env={"DOMINO_TOKEN_FILE": str(missing)}) as backend:
            backend.get_state(ClusterRef("ray", "ray-run1"))
    assert str(refused.value) == (f"[unauthorized] could not read the token in DOMINO_TOKEN_FILE={missing}: "
                                  "No such file or directory")
    assert scaler_server.requests == []
