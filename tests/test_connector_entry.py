"""flytekit's start-up registers the four task types (the ``flytekit.plugins`` entry point) without loading the connector.

A stock ``pyflyte serve connector`` serving them over gRPC (and refusing to start with a configuration it
cannot serve, draining at SIGTERM): tests/test_connector_service.py (every test there
starts the service without ``--modules``) and tests/test_connector_image.py (from the built wheel).
"""
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

from flytekitplugins_ddlscale._services.nodes.names import TASK_TYPES

_PROBE = """
import json, sys
import flytekit  # loads every flytekit.plugins entry point, as in any flytekit process
from flytekit.extend.backend.base_connector import ConnectorRegistry
registered = {t: type(ConnectorRegistry.get_connector(t)).__name__ for t in %r}
listed = [t for agent in ConnectorRegistry.list_connectors() for t in agent.supported_task_types if t.startswith("ddlscale_")]
loaded_before = "flytekitplugins_ddlscale.connector" in sys.modules
answering = {t: type(ConnectorRegistry.get_connector(t).connector).__name__ for t in registered}
metadata = ConnectorRegistry.get_connector(%r).metadata_type.__name__
print(json.dumps(dict(registered=registered, listed=listed, loaded_before=loaded_before, answering=answering,
                      metadata=metadata)))
"""


def test_the_entry_point_flytekit_loads_is_the_registration():
    targets = [ep.value for ep in entry_points(group="flytekit.plugins") if ep.name == "ddlscale"]
    assert targets == ["flytekitplugins_ddlscale.connector_entry"]


def test_import_flytekit_registers_every_task_type_once_and_loads_the_connector_at_the_first_call():
    code = _PROBE % (list(TASK_TYPES), TASK_TYPES[0])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["registered"] == {t: "DeferredConnector" for t in TASK_TYPES}
    assert sorted(seen["listed"]) == sorted(TASK_TYPES)  # each once in ListAgents
    assert seen["loaded_before"] is False  # a process that never serves does not load the connector
    assert seen["answering"] == {t: "ScalingConnector" for t in TASK_TYPES}
    assert seen["metadata"] == "ScalingMetadata"


def test_only_the_connector_service_counts_as_serving():
    from flytekitplugins_ddlscale.connector_entry import serving

    assert serving(["/opt/venv/bin/pyflyte", "serve", "connector"])
    assert serving(["pyflyte", "--verbose", "serve", "connector", "--port", "8000"])
    assert serving(["pyflyte", "serve", "agent"])  # flytekit's older name for the same server
    for argv in (["pyflyte", "run", "--remote", "flow.py", "wf"], ["pyflyte-execute", "--inputs", "x"],
                 ["pyflyte", "serve"], ["python", "-c", "serve connector"], ["c0"], []):
        assert not serving(argv), argv


def test_a_flytekit_process_that_does_not_serve_is_not_stopped_by_the_connectors_settings():
    """A task pod or `pyflyte run` imports the entry point too: a connector setting it cannot use is not its
    business (the service itself refuses to start with it: tests/test_connector_service.py)."""
    env = dict(os.environ, DDLSCALE_CONNECTOR_BACKENDS="kubernets", DDLSCALE_CONNECTOR_CALL_BUDGET="0")
    probe = "import flytekit, sys; print('imported', 'flytekitplugins_ddlscale.connector' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "imported False"
