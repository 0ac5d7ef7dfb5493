"""Each node type's constructor on both surfaces comes from its configuration: one declaration.

The flytekit classes and the Flyte 2 constructors take the node's name, the
fields of its configuration (positionally in their order or by keyword),
then flytekit's task options or Flyte 2's ``env``; ``help()`` and notebooks
show exactly that, and a keyword neither of them knows is refused naming it
instead of vanishing into flytekit's ``**kwargs``.
"""
import dataclasses
import inspect

import pytest
from flytekit import TaskMetadata

from flytekitplugins_ddlscale import tasks
from flytekitplugins_ddlscale.errors import InvalidInputError

flyte = pytest.importorskip("flyte")
from flytekitplugins_ddlscale import flyte2  # noqa: E402

NODE_TYPES = ("ScaleCluster", "WaitForCluster", "RestartHead", "RestoreCluster")
CONFIGS = {
    "ScaleCluster": tasks.ScaleConfig,
    "WaitForCluster": tasks.WaitConfig,
    "RestartHead": tasks.RestartConfig,
    "RestoreCluster": tasks.RestoreConfig,
}


def _fields(config):
    return [field.name for field in dataclasses.fields(config)]


@pytest.mark.parametrize("node_type", NODE_TYPES)
def test_the_flytekit_signature_is_the_name_the_configuration_and_task_options(node_type):
    signature = inspect.signature(getattr(tasks, node_type))
    assert list(signature.parameters) == ["name", *_fields(CONFIGS[node_type]), "task_options"]
    defaults = {field.name: field.default for field in dataclasses.fields(CONFIGS[node_type])}
    for name in _fields(CONFIGS[node_type]):
        assert signature.parameters[name].default in (defaults[name], inspect.Parameter.empty)


@pytest.mark.parametrize("node_type", NODE_TYPES)
def test_the_flyte2_signature_is_the_name_the_configuration_and_env(node_type):
    signature = inspect.signature(getattr(flyte2, node_type))
    assert list(signature.parameters) == ["name", *_fields(CONFIGS[node_type]), "env"]
    assert signature.parameters["env"].kind is inspect.Parameter.KEYWORD_ONLY


def test_a_node_instance_keeps_its_own_call_signature():
    node = tasks.ScaleCluster("up", "dask/train", 2)
    assert "replicas" not in inspect.signature(node).parameters


def test_fields_go_positionally_or_by_keyword_and_task_options_reach_flytekit():
    by_position = tasks.ScaleCluster("up", "dask/train", 3, "gpu-small", None, False, metadata=TaskMetadata(retries=2))
    by_keyword = tasks.ScaleCluster("up", cluster="dask/train", replicas=3, worker_hw_tier="gpu-small", wait=False)
    assert by_position.task_config == by_keyword.task_config
    assert by_position.task_config.worker_hw_tier == "gpu-small" and by_position.task_config.wait is False
    assert by_position.metadata.retries == 2


def test_flytekit_node_refuses_an_unknown_keyword_naming_it_and_what_is_allowed():
    with pytest.raises(TypeError, match=r"ScaleCluster: unexpected keyword argument 'wiat'.*wait.*metadata"):
        tasks.ScaleCluster("up", "dask/train", 3, wiat=False)


def test_flyte2_node_refuses_an_unknown_keyword_naming_it():
    env = flyte.TaskEnvironment("constructors")
    with pytest.raises(TypeError, match=r"RestartHead: unexpected keyword argument 'replicas'"):
        flyte2.RestartHead("restart", "dask/train", replicas=2, env=env)


@pytest.mark.parametrize("surface", ["flytekit", "flyte2"])
def test_a_missing_or_doubled_field_names_the_node_and_the_field(surface):
    env = flyte.TaskEnvironment("constructors")
    extra = {"env": env} if surface == "flyte2" else {}
    make = getattr(flyte2 if surface == "flyte2" else tasks, "ScaleCluster")
    with pytest.raises(TypeError, match=r"ScaleCluster: missing a required argument: 'replicas'"):
        make("up", "dask/train", **extra)
    with pytest.raises(TypeError, match=r"ScaleCluster: multiple values for argument 'replicas'"):
        make("up", "dask/train", 2, replicas=3, **extra)


@pytest.mark.parametrize("surface", ["flytekit", "flyte2"])
def test_a_bad_field_value_is_the_fields_own_error(surface):
    env = flyte.TaskEnvironment("constructors")
    extra = {"env": env} if surface == "flyte2" else {}
    make = getattr(flyte2 if surface == "flyte2" else tasks, "WaitForCluster")
    with pytest.raises(InvalidInputError, match="replicas"):
        make("ready", "dask/train", -5, **extra)
