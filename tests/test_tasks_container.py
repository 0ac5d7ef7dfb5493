"""The container path: `pyflyte-execute` with the serialized command finds the task instance, runs it, writes outputs and the Deck."""
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
from flyteidl.core import literals_pb2
from flytekit import FlyteContextManager
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.core.type_engine import TypeEngine
from flytekit.models.literals import LiteralMap
from flytekit.tools.translator import get_serializable

from flytekitplugins_ddlscale.refs import ClusterRef
from flytekitplugins_ddlscale.tasks import ScaleOutcome
from tests.flyte_apps import nodes
from tests.flyte_support import SCALER_ENV, local_backend, local_env  # noqa: F401 - fixture

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))


@pytest.mark.slow
def test_pyflyte_execute_runs_the_scale_node_like_a_container_would(local_env, tmp_path):
    template = get_serializable(OrderedDict(), SETTINGS, nodes.request).template
    ctx = FlyteContextManager.current_context()
    inputs = TypeEngine.dict_to_literal_map(ctx, {"replicas": 1}, {"replicas": int})
    inputs_path = tmp_path / "inputs.pb"
    inputs_path.write_bytes(inputs.to_flyte_idl().SerializeToString())
    out = tmp_path / "out"
    args = [a.replace("{{.input}}", str(inputs_path)).replace("{{.outputPrefix}}", str(out))
             .replace("{{.rawOutputDataPrefix}}", str(tmp_path / "raw"))
             .replace("{{.checkpointOutputPrefix}}", str(tmp_path / "ckpt"))
             .replace("{{.prevCheckpointPrefix}}", '""')
            for a in template.container.args]
    env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([str(Path(sys.executable).with_name(args[0])), *args[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    proto = literals_pb2.LiteralMap()
    proto.ParseFromString((out / "outputs.pb").read_bytes())
    outputs = TypeEngine.literal_map_to_kwargs(ctx, LiteralMap.from_flyte_idl(proto), {"o0": ScaleOutcome})
    outcome = outputs["o0"]
    assert outcome.cluster == nodes.CLUSTER and outcome.effective == 1 and not outcome.waited
    assert local_backend(local_env).wait_for_workers(ClusterRef.parse(nodes.CLUSTER), 1, timeout=60).ready_workers == 1
    deck = (out / "deck.html").read_text()
    assert "Cluster scaling" in deck and "<svg" in deck
