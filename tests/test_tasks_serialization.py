"""ScaleCluster / RestartHead / WaitForCluster as `pyflyte package` would serialize them."""
import datetime
from collections import OrderedDict

import pytest
from flytekit import TaskMetadata
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.core.python_auto_container import default_task_resolver
from flytekit.tools.translator import get_serializable

from flytekitplugins_ddlscale.errors import InvalidInputError
from flytekitplugins_ddlscale.tasks.base import FLYTE_TIMEOUT_GRACE
from flytekitplugins_ddlscale.tasks import (
    RESTART_TASK_TYPE,
    SCALE_TASK_TYPE,
    WAIT_TASK_TYPE,
    RestartHead,
    RestoreCluster,
    ScaleCluster,
    ScaleConfig,
    WaitForCluster,
    resolve_cluster,
)
from tests.flyte_apps import nodes

SETTINGS = SerializationSettings(
    image_config=ImageConfig(default_image=Image(name="default", fqn="registry/flows", tag="v1"))
)


def serialize(entity):
    return get_serializable(OrderedDict(), SETTINGS, entity)


def test_scale_task_template_carries_config_and_typed_interface():
    template = serialize(nodes.scale_up).template
    assert template.type == SCALE_TASK_TYPE
    assert template.custom == {
        "cluster": "dask/nodes-test", "replicas": 2, "worker_hw_tier": None, "head_hw_tier": None,
        "wait": True, "timeout": 120.0, "strict": False, "backend": None,
        "framework_ready": True, "framework_url": None,
    }
    assert list(template.interface.inputs) == ["cluster", "replicas", "worker_hw_tier", "head_hw_tier"]
    assert template.interface.inputs["replicas"].type.simple is not None
    assert list(template.interface.outputs) == ["o0"]
    assert ScaleConfig.from_custom(template.custom) == nodes.scale_up.task_config


def test_container_command_resolves_the_instance_by_module_and_name():
    args = serialize(nodes.request).template.container.args
    assert args[-4:] == ["task-module", "tests.flyte_apps.nodes", "task-name", "request"]
    assert "flytekit.core.python_auto_container.default_task_resolver" in args
    assert default_task_resolver.load_task(args[-4:]) is nodes.request


def test_restart_and_wait_templates():
    restart = serialize(nodes.restart).template
    assert restart.type == RESTART_TASK_TYPE
    assert restart.custom["cluster"] == "dask/nodes-test"
    wait = serialize(nodes.ready).template
    assert wait.type == WAIT_TASK_TYPE
    assert wait.custom["replicas"] == -1


def test_workflow_nodes_have_order_and_data_dependencies():
    wf = serialize(nodes.up_work_down).template
    by_task = {n.task_node.reference_id.name.split(".")[-1]: n for n in wf.nodes}
    assert set(by_task) == {"scale_up", "count_workers", "scale_down"}
    work = by_task["count_workers"]
    assert by_task["scale_up"].id in work.upstream_node_ids
    assert work.inputs[0].binding.promise.node_id == by_task["scale_up"].id
    assert work.id in by_task["scale_down"].upstream_node_ids


def test_prewarm_binds_wait_to_a_field_of_the_scale_outcome():
    wf = serialize(nodes.prewarmed).template
    wait_node = next(n for n in wf.nodes if n.task_node.reference_id.name.split(".")[-1] == "ready")
    binding = {b.var: b.binding for b in wait_node.inputs}["replicas"]
    assert binding.promise.attr_path == ["effective"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(replicas=-1), "replicas"),
        (dict(replicas=True), "replicas"),
        (dict(replicas=2.5), "replicas"),
        (dict(replicas=1, cluster="foo/bar"), "kind"),
        (dict(replicas=1, cluster="dask/Bad_Name"), "name"),
        (dict(replicas=1, cluster=""), "cluster"),
        (dict(replicas=1, worker_hw_tier=" "), "worker_hw_tier"),
        (dict(replicas=1, timeout=0), "timeout"),
        (dict(replicas=1, wait="yes"), "wait"),
        (dict(replicas=1, backend=""), "backend"),
    ],
)
def test_bad_definitions_are_refused_naming_the_field(kwargs, field):
    kwargs.setdefault("cluster", "dask/ok")
    with pytest.raises(InvalidInputError) as info:
        ScaleCluster("bad", **kwargs)
    assert info.value.field == field


def test_restart_and_wait_validate_too():
    with pytest.raises(InvalidInputError) as info:
        RestartHead("bad", cluster="dask/x", head_hw_tier="")
    assert info.value.field == "head_hw_tier"
    with pytest.raises(InvalidInputError) as info:
        WaitForCluster("bad", cluster="dask/x", replicas=-2)
    assert info.value.field == "replicas"


def test_bare_kind_means_the_runs_own_cluster(monkeypatch):
    monkeypatch.delenv("DOMINO_RUN_ID", raising=False)
    with pytest.raises(InvalidInputError) as info:
        resolve_cluster("ray")
    assert info.value.field == "cluster" and "outside a Domino run" in str(info.value)
    monkeypatch.setenv("DOMINO_RUN_ID", "65F1ab")
    assert str(resolve_cluster("ray")) == "ray/ray-65f1ab"
    assert str(resolve_cluster("ns1/spark/etl")) == "ns1/spark/etl"


def test_config_survives_the_protobuf_round_trip_of_custom():
    from flytekit.models.task import TaskTemplate

    template = serialize(nodes.scale_up).template
    received = TaskTemplate.from_flyte_idl(template.to_flyte_idl())
    assert isinstance(received.custom["replicas"], float)  # Struct stores numbers as doubles
    assert ScaleConfig.from_custom(received.custom) == nodes.scale_up.task_config


def node_of(node_type, name, **options):
    """A node of ``node_type`` on the test cluster (a scale also needs its size)."""
    needed = {"replicas": 2} if node_type is ScaleCluster else {}
    return node_type(name, cluster="dask/nodes-test", **needed, **options)


def test_retries_interruptible_and_timeout_reach_the_template_as_task_sets_them():
    """The same keywords as ``@task``: ``retries``, ``interruptible``; the node's ``timeout`` is its own bound, and
    the template's Flyte timeout (FlytePropeller's backstop) follows it with a grace for the pod or the next GetTask."""
    template = serialize(nodes.retried).template
    assert template.metadata.retries.retries == 3 and template.metadata.interruptible is True
    assert template.metadata.timeout == datetime.timedelta(seconds=600 + FLYTE_TIMEOUT_GRACE)
    assert template.custom["timeout"] == 600.0
    plain = serialize(nodes.scale_up).template.metadata
    assert plain.retries.retries == 0 and not plain.interruptible and not plain.discoverable
    assert plain.timeout == datetime.timedelta(seconds=120 + FLYTE_TIMEOUT_GRACE)


@pytest.mark.parametrize("node_type", [ScaleCluster, WaitForCluster, RestartHead, RestoreCluster])
def test_every_node_type_takes_the_options_as_task_does(node_type):
    metadata = node_of(node_type, "opts", timeout=60, retries=2, interruptible=False).metadata.to_taskmetadata_model()
    assert metadata.retries.retries == 2 and metadata.interruptible is False
    assert metadata.timeout == datetime.timedelta(seconds=60 + FLYTE_TIMEOUT_GRACE) and not metadata.discoverable


@pytest.mark.parametrize("node_type", [ScaleCluster, WaitForCluster, RestartHead, RestoreCluster])
@pytest.mark.parametrize("option", ["cache", "metadata.cache"])
def test_a_node_refuses_a_cache_saying_why(node_type, option):
    given = {"cache": True} if option == "cache" else {"metadata": TaskMetadata(cache=True, cache_version="1")}
    with pytest.raises(InvalidInputError) as info:
        node_of(node_type, "cached", **given)
    assert info.value.field == option
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "must run every time: a cached" in message and "allowed: False" in message
    assert node_type.kind.cached.startswith("a cached ") and node_type.kind.cached in message


def test_cache_false_is_accepted_and_the_task_options_are_checked_naming_them():
    assert not node_of(ScaleCluster, "uncached", cache=False).metadata.cache
    for given, field in [({"retries": -1}, "retries"), ({"retries": True}, "retries"),
                         ({"interruptible": "yes"}, "interruptible"),
                         ({"metadata": TaskMetadata(timeout=5)}, "metadata.timeout")]:
        with pytest.raises(InvalidInputError) as info:
            node_of(ScaleCluster, "bad", **given)
        assert info.value.field == field
    with pytest.raises(TypeError, match="retries given both as a keyword and in metadata="):
        node_of(ScaleCluster, "both", retries=1, metadata=TaskMetadata(retries=2))


def test_task_type_version_is_not_a_user_option():
    """The connector registry serves each ddlscale task type at version 0, the only version a node has."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'task_type_version'"):
        node_of(ScaleCluster, "versioned", task_type_version=1)
    assert serialize(nodes.scale_up).template.task_type_version == 0
