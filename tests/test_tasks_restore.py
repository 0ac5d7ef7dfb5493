"""RestoreCluster: serialized like the other nodes, and restoring real local Dask clusters."""
import logging
from collections import OrderedDict

import pytest
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.core.context_manager import FlyteContextManager
from flytekit.tools.translator import get_serializable

from flytekitplugins_ddlscale import RestoreCluster, RestoreOutcome
from flytekitplugins_ddlscale.errors import InvalidInputError
from flytekitplugins_ddlscale.refs import ClusterRef
from flytekitplugins_ddlscale._services.nodes import interrupted
from flytekitplugins_ddlscale.tasks import RESTORE_TASK_TYPE, RestoreConfig
from tests.flyte_apps import nodes
from tests.flyte_support import local_backend, local_env  # noqa: F401 - fixture

REF = ClusterRef.parse(nodes.CLUSTER)
SETTINGS = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))


def test_restore_template_carries_config_and_typed_interface():
    template = get_serializable(OrderedDict(), SETTINGS, nodes.restore).template
    assert template.type == RESTORE_TASK_TYPE
    assert template.id.name == "tests.flyte_apps.nodes.restore"
    assert template.custom == {
        "cluster": "dask/nodes-test", "replicas": -1, "worker_hw_tier": None,
        "wait": True, "timeout": 120.0, "backend": None, "framework_ready": True, "framework_url": None,
    }
    assert list(template.interface.inputs) == ["cluster", "replicas", "worker_hw_tier"]
    assert list(template.interface.outputs) == ["o0"]
    assert RestoreConfig.from_custom(template.custom) == nodes.restore.task_config
    assert template.container.args[-4:] == ["task-module", "tests.flyte_apps.nodes", "task-name", "restore"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(replicas=-2), "replicas"),
        (dict(replicas=True), "replicas"),
        (dict(worker_hw_tier="Small"), "worker_hw_tier"),  # a tier needs an explicit size
        (dict(replicas=1, worker_hw_tier=" "), "worker_hw_tier"),
        (dict(timeout=-1), "timeout"),
        (dict(cluster="dask-x"), "cluster"),
    ],
)
def test_bad_restore_definitions_are_refused_naming_the_field(kwargs, field):
    kwargs.setdefault("cluster", "dask/ok")
    with pytest.raises(InvalidInputError) as info:
        RestoreCluster("bad", **kwargs)
    assert info.value.field == field


@pytest.mark.slow
def test_flow_ends_at_the_baseline_without_naming_it(local_env, caplog):
    # In-process, pytest's handlers count as configured logging, so the lines arrive as log records.
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    assert nodes.up_work_restore() == 2
    # The flow created the cluster, so its baseline is "no cluster": restoring takes it down.
    assert local_backend(local_env).list_clusters() == []
    err = caplog.text
    assert "scale_up: dask/nodes-test 0 -> 2 workers ready in" in err
    assert "restore: dask/nodes-test 2 -> 0 workers (baseline) in" in err


@pytest.mark.slow
def test_explicit_size_and_nothing_recorded(local_env):
    backend = local_backend(local_env)
    backend.up(REF, 1, timeout=120)  # made outside any flow: no baseline
    params = FlyteContextManager.current_context().user_space_params
    before = len(params.decks)
    nothing = nodes.restore.execute(cluster=nodes.CLUSTER, replicas=-1, worker_hw_tier=None)
    assert isinstance(nothing, RestoreOutcome)
    assert (nothing.restored, nothing.previous_workers, nothing.workers) == ("nothing recorded", 1, 1)
    given = nodes.restore.execute(cluster=nodes.CLUSTER, replicas=2, worker_hw_tier=None)
    assert (given.restored, given.previous_workers, given.workers, given.ready_workers) == ("given size", 1, 2, 2)
    assert backend.get_state(REF).ready_workers == 2
    # Each node's Deck goes first, so the task's Deck file opens on it.
    assert len(params.decks) == before + 2 and [d.name for d in params.decks[:2]] == ["Cluster restore"] * 2


@pytest.mark.slow
def test_interrupted_flow_names_what_is_left_running_and_how_to_stop_it(local_env, capfd):
    nodes.scale_up(replicas=1)
    interrupted.report_left_running()
    err = capfd.readouterr().err
    assert "ddlscale: interrupted; left running by this flow:" in err
    assert "dask/nodes-test: Running, 1 worker; to stop it: ddlscale local down --name nodes-test" in err
    nodes.scale_down()
    local_backend(local_env).down(REF)
    interrupted.report_left_running()
    assert "left running" not in capfd.readouterr().err


@pytest.mark.slow
def test_failure_handler_prints_what_it_restored(local_env, caplog):
    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    with pytest.raises(Exception, match="stage failed on purpose"):
        nodes.failing(fail=True)
    assert "cleanup: dask/nodes-test 2 -> 0 workers (baseline) in" in caplog.text
    assert local_backend(local_env).list_clusters() == []


@pytest.mark.slow
def test_a_phase_between_nodes_gives_back_what_it_found_and_restore_cluster_the_baseline(local_env, caplog):
    from tests.flyte_apps import gives_back

    caplog.set_level(logging.INFO, logger="flytekitplugins_ddlscale")
    seen, after, done = gives_back.node_phase_node()
    assert (seen, after) == (3, 1)  # the phase held 3 for its body and gave back the 1 worker it found
    assert (done.restored, done.previous_workers, done.workers) == ("baseline", 1, 0)
    assert "restored to 1 worker (as found)" in caplog.text
    assert local_backend(local_env).list_clusters() == []  # the baseline was "no cluster"


def test_each_backend_names_its_own_stop_command_and_a_remote_cluster_is_not_read(monkeypatch, capfd):
    from flytekitplugins_ddlscale.refs import ClusterRef

    ref = ClusterRef("dask", "train", namespace="team-a")
    assert interrupted.stop_command("local", ref) == "ddlscale local down --name train"
    # `local down` takes dask unless told: another kind is named, or the command would miss the cluster.
    assert interrupted.stop_command("local", ClusterRef("ray", "train")) == "ddlscale local down --kind ray --name train"
    assert interrupted.stop_command("kubernetes", ref) == (
        "ddlscale restore --backend kubernetes --kind dask --name train --namespace team-a"
    )
    # A scaler URL nothing listens on: reading it would fail or wait, so the report must only name it.
    monkeypatch.setenv("CLUSTER_SCALER_BASE_URL", "http://127.0.0.1:9")
    interrupted.forget_all()
    interrupted.remember("scaler", ref)
    try:
        interrupted.report_left_running()
    finally:
        interrupted.forget_all()
    err = capfd.readouterr().err
    assert "team-a/dask/train (scaler backend): may still be scaled; to restore it: " \
        "ddlscale restore --backend scaler --kind dask --name train --namespace team-a" in err
