"""scale_down_on_failure: a handler flytekit accepts for on_failure, refusing what it would not."""
from collections import OrderedDict

import pytest
from flytekit import kwtypes, task, workflow
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.tools.translator import get_serializable
from flytekit.exceptions.user import FlyteFailureNodeInputMismatchException

from flytekitplugins_ddlscale.errors import InvalidInputError
from flytekitplugins_ddlscale.workflow_helpers import scale_down_on_failure


SETTINGS = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))


@task
def step(n: int) -> int:
    return n


handler = scale_down_on_failure("h1", cluster="dask/x", inputs=kwtypes(n=int), replicas=0)


def test_handler_declares_the_workflow_inputs_plus_optional_err():
    assert list(handler.python_interface.inputs) == ["n", "err"]
    assert handler.get_custom(None) == {"cluster": "dask/x", "replicas": 0, "timeout": 900.0, "backend": None}

    @workflow(on_failure=handler)
    def ok(n: int) -> int:
        return step(n=n)

    spec = get_serializable(OrderedDict(), SETTINGS, ok)
    assert spec.template.failure_node.task_node.reference_id.name == f"{__name__}.h1"


mismatched = scale_down_on_failure("h2", cluster="dask/x", inputs=kwtypes(m=str))


def test_mismatched_inputs_are_refused_by_flytekit():
    with pytest.raises(FlyteFailureNodeInputMismatchException):

        @workflow(on_failure=mismatched)
        def bad(n: int) -> int:
            return step(n=n)

        get_serializable(OrderedDict(), SETTINGS, bad)


def test_bad_arguments_are_refused_when_defined():
    with pytest.raises(InvalidInputError) as info:
        scale_down_on_failure("h3", cluster="dask/x", replicas=-1)
    assert info.value.field == "replicas"
    with pytest.raises(InvalidInputError) as info:
        scale_down_on_failure("h4", cluster="dask/x", inputs={"err": str})
    assert info.value.field == "inputs"
