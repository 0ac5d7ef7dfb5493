"""flytekit's start-up registers the four task types (the ``flytekit.plugins`` entry point) without loading the connector.

A stock ``pyflyte serve connector`` serving them over gRPC: tests/test_connector_service.py (every test there
starts the service without ``--modules``) and tests/test_connector_image.py (from the built wheel).
"""
import json
import subprocess
import sys
from importlib.metadata import entry_points

from flytekitplugins_ddlscale._services.nodes.registry import TASK_TYPES

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
