"""One list of a phase's options: every phase surface takes exactly ``PhaseOptions`` and checks them alike.

The surfaces are the flytekit ``distributed_phase``, ``cluster_phase`` and
the Flyte 2 ``distributed_phase``; ``ddlscale run`` builds a ``cluster_phase``.
Nothing here starts a cluster: arguments are refused when the phase is defined.
"""
import dataclasses
import inspect

import pytest

from flytekitplugins_ddlscale._services.hold.settings import PhaseOptions, PhaseSettings
from flytekitplugins_ddlscale._services.nodes.scale import ScaleConfig
from flytekitplugins_ddlscale.errors import InvalidInputError
from flytekitplugins_ddlscale.models import ReplicaSpec
from flytekitplugins_ddlscale.phase import cluster_phase, distributed_phase

CLUSTER = "dask/options"
# One value per option that PhaseSettings refuses, and the field its error names.
BAD_VALUES = {
    "worker_hw_tier": ("", "worker_hw_tier"),
    "head_hw_tier": (7, "head_hw_tier"),
    "restore": (ReplicaSpec(replicas=-2), "restore.replicas"),
    "timeout": (-5, "timeout"),
    "backend": ("  ", "backend"),
    "framework_ready": ("yes", "framework_ready"),
    "framework_url": ("not a url", "framework_url"),
    "reassert_interval": (0, "reassert_interval"),
    "sample_interval": (-1, "sample_interval"),
    "lease_seconds": (10**6, "lease_seconds"),
    "fail_on_fault": (1, "fail_on_fault"),
}


def flyte2_phase():
    pytest.importorskip("flyte", reason="the flyte2 extra is not installed")
    from flytekitplugins_ddlscale.flyte2 import distributed_phase as flyte2_distributed_phase

    return flyte2_distributed_phase


SURFACES = {
    "flytekit distributed_phase": lambda: distributed_phase,
    "cluster_phase": lambda: cluster_phase,
    "flyte2 distributed_phase": flyte2_phase,
}


def test_the_options_are_the_settings_fields_beyond_cluster_size_and_page():
    fields = [f.name for f in dataclasses.fields(PhaseSettings)]
    assert fields[:2] == ["cluster", "replicas"]
    assert set(fields) - {"cluster", "replicas", "deck"} == set(PhaseOptions.__annotations__)


def test_every_option_has_a_refused_value_in_this_test():
    assert set(BAD_VALUES) == set(PhaseOptions.__annotations__)


@pytest.mark.parametrize("surface", SURFACES)
def test_each_surface_takes_the_cluster_the_size_one_own_keyword_and_the_options(surface):
    parameters = list(inspect.signature(SURFACES[surface]()).parameters.values())
    assert [p.name for p in parameters[:2]] == ["cluster", "replicas"]
    assert parameters[-1].kind is inspect.Parameter.VAR_KEYWORD and parameters[-1].name == "options"
    own = {p.name for p in parameters[2:-1]}
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[2:-1])
    assert own & set(PhaseOptions.__annotations__) == set()


@pytest.mark.parametrize("option", sorted(BAD_VALUES))
@pytest.mark.parametrize("surface", SURFACES)
def test_each_surface_refuses_a_bad_option_naming_it(surface, option):
    value, field = BAD_VALUES[option]
    with pytest.raises(InvalidInputError) as info:
        SURFACES[surface]()(CLUSTER, 2, **{option: value})
    assert info.value.field == field


@pytest.mark.parametrize("surface", SURFACES)
def test_each_surface_refuses_an_option_that_is_not_one(surface):
    with pytest.raises(TypeError, match="wait_for"):
        SURFACES[surface]()(CLUSTER, 2, wait_for=3)


def test_a_backend_name_is_read_alike_by_a_phase_and_a_node():
    assert PhaseSettings(CLUSTER, 2, backend=" Local ").backend == "local"
    assert ScaleConfig(cluster=CLUSTER, replicas=2, backend=" Local ").backend == "local"
