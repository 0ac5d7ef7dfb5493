"""The examples: the README quick start runs end to end with `pyflyte run`; the Domino ones serialize."""
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.tools.translator import get_serializable

from tests.flyte_support import SCALER_ENV, processes_mentioning

ROOT = Path(__file__).resolve().parent.parent
PYFLYTE = Path(sys.executable).with_name("pyflyte")
SETTINGS = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))


def quick_start_env(state: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV}
    env.update(DDLSCALE_STATE_DIR=str(state), DDLSCALE_EXAMPLE_PREPARE_SECONDS="1")
    return env


@pytest.mark.slow
def test_quick_start_runs_end_to_end_and_leaves_nothing_running(tmp_path):
    state = tmp_path / "state"
    done = subprocess.run(
        [str(PYFLYTE), "run", "examples/hybrid_flow.py", "hybrid_flow", "--n", "5000"],
        cwd=ROOT, env=quick_start_env(state), capture_output=True, text=True, timeout=300,
    )
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.strip().splitlines()[-1] == "True"
        assert processes_mentioning(str(state)) == []
        assert not list((state / "local" / "clusters").glob("*/cluster.json"))
    finally:
        subprocess.run([str(PYFLYTE.with_name("ddlscale")), "local", "down", "--all"],
                       env=quick_start_env(state), capture_output=True, timeout=120)


@pytest.mark.parametrize("module, workflow", [("ray_domino", "ray_training"), ("spark_domino", "spark_etl")])
def test_domino_examples_serialize_with_their_settings(module, workflow, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    mod = __import__(module)
    wf = get_serializable(OrderedDict(), SETTINGS, getattr(mod, workflow)).template
    from flytekit.core.base_task import PythonTask

    tasks = {t.name: t for t in vars(mod).values() if isinstance(t, PythonTask)}
    types = set()
    for node in wf.nodes:
        task = tasks[node.task_node.reference_id.name]
        template = get_serializable(OrderedDict(), SETTINGS, task).template
        types.add(template.type)
        if template.type.startswith("ddlscale"):
            assert template.custom["cluster"] in ("ray", "spark")
    assert {"ddlscale_scale", "python-task"} <= types
