"""What a template (or a resource metadata) may make the connector do: only the backends, namespaces,
clusters and framework heads the connector's own environment serves, and only bounded waits.

A refused or malformed node ends FAILED with a one-line message naming the field, the value and what
is allowed, and nothing is started or sent: checked against the local backend's state (no cluster,
no process: ``local_env`` fails the test if one is left) and the scaler test server's request log.
"""
import asyncio
import json
import math
import time

import pytest
from flyteidl.core.execution_pb2 import TaskExecution

from flytekitplugins_ddlscale.connector import NOT_READY, ScalingConnector, ScalingMetadata
from flytekitplugins_ddlscale._services.connector_policy import ConnectorPolicy
from flytekitplugins_ddlscale.errors import InvalidInputError
from flytekitplugins_ddlscale.tasks import (
    RESTART_TASK_TYPE,
    RESTORE_TASK_TYPE,
    SCALE_TASK_TYPE,
    WAIT_TASK_TYPE,
    ScaleCluster,
    WaitForCluster,
)
from flytekitplugins_ddlscale._core.validation import MAX_NODE_TIMEOUT
from tests.flyte_support import local_backend, local_env  # noqa: F401 - fixture
from tests.framework_support import use_scaler
from tests.servers.scaler_server import ScalerTestServer
from tests.port_support import free_port
from tests.servers.status_http import StatusServer
from tests.test_connector import ray_restart, ray_restore, template_and_inputs

IMAGE = "registry/flows:v1"
UNLISTED_HOST = "http://10.1.2.3:8265"

# Nodes are serialized from module scope, as flytekit requires.
local_node = ScaleCluster("local_node", cluster="dask/conn-local", replicas=2, backend="local", container_image=IMAGE)
default_node = ScaleCluster("default_node", cluster="dask/conn-local", replicas=2, container_image=IMAGE)
scaler_node = ScaleCluster("scaler_node", cluster="dask/nodes-test", replicas=2, backend="scaler", container_image=IMAGE)
wait_node = WaitForCluster("wait_node", cluster="dask/nodes-test", timeout=60, container_image=IMAGE)
fw_node = ScaleCluster("fw_node", cluster="ray/ray-fw", replicas=2, timeout=60, framework_url=UNLISTED_HOST,
                       container_image=IMAGE)
fw_wait = WaitForCluster("fw_wait", cluster="ray/ray-fw", replicas=1, timeout=60, container_image=IMAGE)
endless = ScaleCluster("endless", cluster="dask/nodes-test", replicas=2, timeout=60, container_image=IMAGE)


def refused(connector, template, inputs):
    """The one-line message a refused node fails with: ``create`` answers a refused metadata (nothing sent),
    whose first ``get`` is FAILED with it (what the connector service answers)."""
    meta = connector.create(template, "", inputs)
    assert meta.error and meta.cluster == "", meta
    resource = asyncio.run(connector.get(ScalingMetadata.decode(meta.encode())))
    message = resource.message
    assert resource.phase == TaskExecution.FAILED and message == meta.error
    assert "Traceback" not in message and "\n" not in message
    return message


@pytest.fixture
def scaler(tmp_path, monkeypatch):
    """The scaler test server with dask/nodes-test (1 worker) and ray/ray-fw, chosen through the environment."""
    with ScalerTestServer(pod_ready_delay=0.1) as server:
        server.add_cluster("dask", "nodes-test", replicas=1, max_replicas=4)
        server.add_cluster("ray", "ray-fw", replicas=1, max_replicas=4, min_replicas=None)
        use_scaler(monkeypatch, server, tmp_path / "state")
        for name in ("DDLSCALE_CONNECTOR_BACKENDS", "DDLSCALE_CONNECTOR_NAMESPACES", "DDLSCALE_CONNECTOR_CLUSTERS",
                     "DDLSCALE_CONNECTOR_FRAMEWORK_HOSTS"):
            monkeypatch.delenv(name, raising=False)
        server.clear_requests()
        yield server


# ----- backends -----

@pytest.mark.parametrize("node", [local_node, default_node])
def test_the_local_backend_is_not_served_unless_listed(node, local_env, monkeypatch):
    monkeypatch.delenv("DDLSCALE_CONNECTOR_BACKENDS", raising=False)
    template, inputs = template_and_inputs(node, replicas=2)
    message = refused(ScalingConnector(SCALE_TASK_TYPE), template, inputs)
    # default_node: the connector's environment chooses, and with nothing configured that is local.
    assert message.startswith("[not_served] invalid backend='local': not served by this connector")
    assert "$DDLSCALE_CONNECTOR_BACKENDS" in message and message.endswith("allowed: scaler, kubernetes")
    assert local_backend(local_env).list_clusters() == []


def test_a_backend_not_listed_is_refused_without_a_request(scaler, monkeypatch):
    monkeypatch.setenv("DDLSCALE_CONNECTOR_BACKENDS", "k8s")
    template, inputs = template_and_inputs(scaler_node, replicas=2)
    message = refused(ScalingConnector(SCALE_TASK_TYPE), template, inputs)
    assert "invalid backend='scaler'" in message and message.endswith("allowed: kubernetes")
    assert scaler.requests == []


def test_the_backend_list_is_checked_when_the_connector_starts():
    with pytest.raises(InvalidInputError, match="DDLSCALE_CONNECTOR_BACKENDS") as raised:
        ConnectorPolicy.from_env({"DDLSCALE_CONNECTOR_BACKENDS": "scaler,lokal"})
    assert "kubernetes, local, scaler" in str(raised.value)
    assert ConnectorPolicy.from_env({"DDLSCALE_CONNECTOR_BACKENDS": " K8S, service ,local"}).backends == (
        "kubernetes", "scaler", "local")
    assert ConnectorPolicy.from_env({}).backends == ("scaler", "kubernetes")


# ----- namespaces and clusters -----

def test_namespaces_and_clusters_not_listed_are_refused_without_a_request(scaler, monkeypatch):
    template, inputs = template_and_inputs(wait_node)
    monkeypatch.setenv("DDLSCALE_CONNECTOR_NAMESPACES", "team-a")
    message = refused(ScalingConnector(WAIT_TASK_TYPE), template, inputs)
    assert "invalid namespace='domino-compute'" in message and message.endswith("allowed: team-a")
    monkeypatch.delenv("DDLSCALE_CONNECTOR_NAMESPACES")
    monkeypatch.setenv("DDLSCALE_CONNECTOR_CLUSTERS", "dask/team-a-*,ray/*")
    message = refused(ScalingConnector(WAIT_TASK_TYPE), template, inputs)
    assert "invalid cluster='dask/nodes-test'" in message and message.endswith("allowed: dask/team-a-*, ray/*")
    assert scaler.requests == []
    monkeypatch.setenv("DDLSCALE_CONNECTOR_CLUSTERS", "dask/nodes-*")
    connector = ScalingConnector(WAIT_TASK_TYPE)
    meta = connector.create(template, "", inputs)
    assert meta.error == "" and asyncio.run(connector.get(meta)).phase != TaskExecution.FAILED and scaler.requests


@pytest.mark.parametrize("task_type, node", [(RESTORE_TASK_TYPE, ray_restore), (RESTART_TASK_TYPE, ray_restart)])
def test_restore_and_restart_nodes_get_the_same_checks_without_a_request(task_type, node, scaler, monkeypatch):
    template, inputs = template_and_inputs(node)
    monkeypatch.setenv("DDLSCALE_CONNECTOR_BACKENDS", "kubernetes")
    assert "invalid backend='scaler'" in refused(ScalingConnector(task_type), template, inputs)
    monkeypatch.delenv("DDLSCALE_CONNECTOR_BACKENDS")
    monkeypatch.setenv("DDLSCALE_CONNECTOR_NAMESPACES", "team-a")
    assert "invalid namespace='domino-compute'" in refused(ScalingConnector(task_type), template, inputs)
    monkeypatch.delenv("DDLSCALE_CONNECTOR_NAMESPACES")
    monkeypatch.setenv("DDLSCALE_CONNECTOR_CLUSTERS", "dask/*")
    message = refused(ScalingConnector(task_type), template, inputs)
    assert message.startswith("[not_served] invalid cluster='ray/conn-ray'") and message.endswith("allowed: dask/*")
    assert scaler.requests == []


# ----- framework heads -----

def test_a_framework_url_on_a_host_not_allowed_is_refused(scaler, monkeypatch):
    template, inputs = template_and_inputs(fw_node, replicas=2)
    message = refused(ScalingConnector(SCALE_TASK_TYPE), template, inputs)
    assert f"invalid framework_url='{UNLISTED_HOST}': host '10.1.2.3' is not a head" in message
    assert "$DDLSCALE_CONNECTOR_FRAMEWORK_HOSTS" in message
    assert scaler.requests == []
    monkeypatch.setenv("DDLSCALE_CONNECTOR_FRAMEWORK_HOSTS", "10.1.*")
    assert ScalingConnector(SCALE_TASK_TYPE).create(template, "", inputs).error == ""


def test_the_head_the_backend_reports_is_allowed():
    policy = ConnectorPolicy()
    policy.check_framework_url("http://demo-head-svc.ns.svc:8265", ["demo-head-svc.ns.svc"])
    with pytest.raises(InvalidInputError, match="allowed: a URL on demo-head-svc.ns.svc"):
        policy.check_framework_url("http://metadata.internal:80", ["demo-head-svc.ns.svc"])


def test_a_forged_metadata_reads_no_head_that_is_not_allowed(scaler):
    with StatusServer() as head:
        connector = ScalingConnector(WAIT_TASK_TYPE)
        now = time.time()
        meta = ScalingMetadata(WAIT_TASK_TYPE, "ray/ray-fw", "", 1, now, now + 60, "{}", framework_url=head.url)
        resource = asyncio.run(connector.get(ScalingMetadata.decode(meta.encode())))
        assert resource.phase == TaskExecution.FAILED and "invalid framework_url=" in resource.message
        assert head.requests == []


def test_a_failed_framework_read_tells_the_caller_only_that_it_failed(scaler, monkeypatch):
    """Refused, 404 and not-JSON answers look alike to the caller: a template cannot map ports."""
    monkeypatch.setenv("DDLSCALE_CONNECTOR_FRAMEWORK_HOSTS", "127.0.0.1")
    connector = ScalingConnector(WAIT_TASK_TYPE)
    with StatusServer() as not_a_head:  # answers 404 to every path
        messages = []
        for url in (f"http://127.0.0.1:{free_port()}", not_a_head.url):
            template, inputs = template_and_inputs(fw_wait)
            template.custom["framework_url"] = url
            meta = connector.create(template, "", inputs)
            resource = asyncio.run(connector.get(meta))
            assert resource.phase == TaskExecution.RUNNING
            messages.append(resource.message.replace(url, "<url>"))
        assert not_a_head.requests  # the 404 came from a real answer
    assert messages[0] == messages[1] and NOT_READY in messages[0]
    assert "404" not in messages[1] and "refused" not in messages[0].lower()


# ----- timeouts and malformed input -----

@pytest.mark.parametrize("timeout", [1e300, math.inf, math.nan, -1.0, 0, MAX_NODE_TIMEOUT + 1])
def test_node_timeouts_are_bounded(timeout):
    with pytest.raises(InvalidInputError, match="timeout") as raised:
        ScaleCluster("t", cluster="dask/x", replicas=1, timeout=timeout)
    assert "up to 86400 (24 h)" in str(raised.value)
    assert WaitForCluster("t", cluster="dask/x", timeout=MAX_NODE_TIMEOUT).python_interface is not None


def test_a_template_with_an_endless_timeout_is_refused_without_a_request(scaler):
    template, inputs = template_and_inputs(endless, replicas=2)
    template.custom["timeout"] = 1e300  # as a hand-made template would carry it
    message = refused(ScalingConnector(SCALE_TASK_TYPE), template, inputs)
    assert message.startswith("[invalid_input] invalid timeout=1e+300; allowed: a positive number of seconds up to")
    del template.custom["cluster"]
    assert "invalid custom.cluster=None" in refused(ScalingConnector(SCALE_TASK_TYPE), template, inputs)
    assert scaler.requests == []


@pytest.mark.parametrize("data, field", [
    (b"{not json", "resource_meta='<not JSON>'"),
    (b"[1, 2]", "resource_meta='list'"),
    (json.dumps({"task_type": WAIT_TASK_TYPE, "target": "two"}).encode(), "resource_meta.target='str'"),
    (json.dumps({"task_type": WAIT_TASK_TYPE, "target": 2}).encode(), "resource_meta.cluster=None"),
    (json.dumps({"task_type": WAIT_TASK_TYPE, "cluster": "dask/nodes-test", "backend": "", "target": 1,
                 "started": 0, "deadline": 1e300, "outcome": "{}"}).encode(), "resource_meta.deadline=1e+300"),
    (json.dumps({"task_type": WAIT_TASK_TYPE, "cluster": "dask/nodes-test", "backend": "", "target": 1,
                 "started": 0, "deadline": "NaN", "outcome": "{}"}).encode(), "resource_meta.deadline='str'"),
    (json.dumps({"task_type": "other", "cluster": "dask/nodes-test", "backend": "", "target": 1,
                 "started": 0, "deadline": 1, "outcome": "{}"}).encode(), "resource_meta.task_type='other'"),
])
def test_malformed_metadata_is_failed_with_a_short_message(data, field, scaler):
    resource = asyncio.run(ScalingConnector(WAIT_TASK_TYPE).get(ScalingMetadata.decode(data)))
    assert resource.phase == TaskExecution.FAILED and f"invalid {field}" in resource.message
    assert "Traceback" not in resource.message and "\n" not in resource.message
    assert scaler.requests == []
