"""The container path: `pyflyte-execute` with the serialized command finds the task instance, runs it, writes outputs
and the Deck, or an error document whose kind decides whether FlytePropeller applies the task's ``retries``."""
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from flyteidl.core import errors_pb2, literals_pb2
from flytekit import FlyteContextManager
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.core.type_engine import TypeEngine
from flytekit.models.literals import LiteralMap
from flytekit.tools.translator import get_serializable

from flytekitplugins_ddlscale.errors import NeverReachedError
from flytekitplugins_ddlscale.refs import ClusterRef
from flytekitplugins_ddlscale.tasks import ScaleOutcome
from tests.flyte_apps import nodes, phased
from tests.flyte_support import SCALER_ENV, local_backend, local_env  # noqa: F401 - fixture
from tests.servers.scaler_server import DEFAULT_API_KEY, OTHER_API_KEY, ScalerTestServer

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))
RECOVERABLE = errors_pb2.ContainerError.RECOVERABLE
NON_RECOVERABLE = errors_pb2.ContainerError.NON_RECOVERABLE


def pyflyte_execute(task: Any, inputs: Dict[str, Any], tmp_path: Path, env: Optional[Dict[str, str]] = None):
    """Run ``task`` as its pod would: the serialized container command, its inputs written as ``inputs.pb``.

    Returns the finished process and the output prefix (``outputs.pb``, ``deck.html`` or ``error.pb``).
    """
    template = get_serializable(OrderedDict(), SETTINGS, task).template
    ctx = FlyteContextManager.current_context()
    types = {name: task.python_interface.inputs[name] for name in inputs}
    literals = TypeEngine.dict_to_literal_map(ctx, inputs, types)
    inputs_path = tmp_path / "inputs.pb"
    inputs_path.write_bytes(literals.to_flyte_idl().SerializeToString())
    out = tmp_path / "out"
    args = [a.replace("{{.input}}", str(inputs_path)).replace("{{.outputPrefix}}", str(out))
             .replace("{{.rawOutputDataPrefix}}", str(tmp_path / "raw"))
             .replace("{{.checkpointOutputPrefix}}", str(tmp_path / "ckpt"))
             .replace("{{.prevCheckpointPrefix}}", '""')
            for a in template.container.args]
    environ = {k: v for k, v in os.environ.items() if k not in SCALER_ENV}
    environ.update(env or {}, PYTHONPATH=str(ROOT))
    done = subprocess.run([str(Path(sys.executable).with_name(args[0])), *args[1:]], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=180)
    return done, out


def error_document(out: Path) -> errors_pb2.ContainerError:
    """The error the pod wrote for FlytePropeller (``error.pb``)."""
    document = errors_pb2.ErrorDocument()
    document.ParseFromString((out / "error.pb").read_bytes())
    return document.error


def scaler_env(url: str, tmp_path: Path, api_key: str = DEFAULT_API_KEY) -> Dict[str, str]:
    """A pod's environment for the scaler backend at ``url``."""
    return {"CLUSTER_SCALER_BASE_URL": url, "DOMINO_API_KEY": api_key, "DDLSCALE_STATE_DIR": str(tmp_path / "state")}


def stopped_server_url() -> str:
    """The address of a scaler test server that was started and stopped: connections to it are refused."""
    with ScalerTestServer() as server:
        url = server.url
    return url


@pytest.mark.slow
def test_pyflyte_execute_runs_the_scale_node_like_a_container_would(local_env, tmp_path):
    done, out = pyflyte_execute(nodes.request, {"replicas": 1}, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    proto = literals_pb2.LiteralMap()
    proto.ParseFromString((out / "outputs.pb").read_bytes())
    ctx = FlyteContextManager.current_context()
    outputs = TypeEngine.literal_map_to_kwargs(ctx, LiteralMap.from_flyte_idl(proto), {"o0": ScaleOutcome})
    outcome = outputs["o0"]
    assert outcome.cluster == nodes.CLUSTER and outcome.effective == 1 and not outcome.waited
    assert local_backend(local_env).wait_for_workers(ClusterRef.parse(nodes.CLUSTER), 1, timeout=60).ready_workers == 1
    deck = (out / "deck.html").read_text()
    assert "Cluster scaling" in deck and "<svg" in deck
    assert not (out / "error.pb").exists()


@pytest.mark.slow
def test_a_node_whose_backend_is_down_fails_recoverable_so_flyte_retries_it(tmp_path):
    """The scaler service stopped (connections refused): the pod's error document is RECOVERABLE."""
    done, out = pyflyte_execute(nodes.request, {"replicas": 2}, tmp_path, scaler_env(stopped_server_url(), tmp_path))
    error = error_document(out)
    assert error.kind == RECOVERABLE, error.message
    assert "NeverReachedError" in error.message and "could not be reached" in error.message
    assert "RecoverableScalingError" in error.message and "retries" in error.message


@pytest.mark.slow
def test_a_phase_whose_backend_answers_503_fails_recoverable_so_flyte_retries_it(tmp_path):
    with ScalerTestServer() as server:
        server.add_cluster("dask", phased.CLUSTER.split("/")[1], replicas=1, max_replicas=4)
        server.inject_faults("status", count=10_000, status=503)
        done, out = pyflyte_execute(phased.total_on_cluster, {"values": [1, 2], "scale": 1}, tmp_path,
                                    scaler_env(server.url, tmp_path))
        assert server.count("PATCH") == 0  # nothing was changed: the baseline read already failed
    error = error_document(out)
    assert error.kind == RECOVERABLE, error.message
    assert "BackendUnavailableError" in error.message and "HTTP 503" in error.message


@pytest.mark.slow
@pytest.mark.parametrize("case", ["invalid input", "access", "cluster state"])
def test_bad_input_access_and_cluster_state_failures_stay_non_recoverable(tmp_path, case):
    """A retry would meet the same answer: the error document is NON_RECOVERABLE, whatever ``retries`` says."""
    with ScalerTestServer() as server:
        server.add_cluster("dask", nodes.CLUSTER.split("/")[1], replicas=1, max_replicas=4)
        replicas, env, expected = {
            "invalid input": (-3, scaler_env(server.url, tmp_path), "InvalidInputError"),
            "access": (2, scaler_env(server.url, tmp_path, api_key=OTHER_API_KEY), "UnauthorizedError"),
            "cluster state": (2, scaler_env(server.url, tmp_path), "ClusterNotFoundError"),
        }[case]
        if case == "cluster state":
            server.remove_cluster("dask", nodes.CLUSTER.split("/")[1])
        done, out = pyflyte_execute(nodes.request, {"replicas": replicas}, tmp_path, env)
    error = error_document(out)
    assert error.kind == NON_RECOVERABLE, error.message
    assert expected in error.message and "RecoverableScalingError" not in error.message


def test_a_local_run_keeps_the_typed_error(tmp_path, monkeypatch):
    """Only a task pod reports recoverable: a local flow (flytekit retries nothing there) raises the typed error."""
    for name in SCALER_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in scaler_env(stopped_server_url(), tmp_path).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(NeverReachedError):
        nodes.request(replicas=2)


def test_the_pod_retries_what_the_connector_retries():
    """Both modes treat the same failures as the backend being unavailable for now."""
    from flytekitplugins_ddlscale._services.connector_core import UNAVAILABLE_HERE
    from flytekitplugins_ddlscale._services.recoverable import RETRYABLE

    assert set(RETRYABLE) == set(UNAVAILABLE_HERE)
