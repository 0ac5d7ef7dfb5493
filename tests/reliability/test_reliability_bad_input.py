"""Bad input is refused before anything changes, with a message naming the field and allowed values.

Each case is tried through the backend API, the ScaleCluster task (flytekit
local execution), @distributed_phase and the CLI, against the scaler test
server; the server's request log must show no mutating request.
"""
from typing import Any, Dict

import pytest
from click.testing import CliRunner
from rel_helpers import desired, mutations

from flytekitplugins_ddlscale import ClusterRef, InvalidInputError, ScalingError, UnknownTierError
from flytekitplugins_ddlscale.errors import UnsupportedOperationError
from tests.servers.scaler_server import OTHER_USER

NAME = "ray-input"
REF = ClusterRef("ray", NAME)

BAD_REPLICAS = [-1, -1000, 10**6, 2**63, 2.5, 3.0, "3", None, True, False, float("nan")]
BAD_TIMEOUTS = [0, -1, 0.0, -0.5, float("nan"), float("inf"), "10", None, True]
BAD_NAMES = ["", "Upper", "under_score", "-lead", "trail-", "a" * 64, "dots.in.name", "sp ace", "ray/x"]
BAD_KINDS = ["", "raycluster", "kube", "RAYS", "mpi-cluster", None, 3]


@pytest.fixture
def cluster(scaler_server):
    scaler_server.add_cluster("ray", NAME, replicas=1, max_replicas=6)
    scaler_server.add_cluster("ray", "ray-foreign", replicas=1, max_replicas=6, owner=OTHER_USER)
    return REF


def assert_invalid(exc: BaseException, field: str) -> None:
    """``exc`` is an InvalidInputError about ``field`` whose message names the field and what is allowed."""
    assert isinstance(exc, InvalidInputError), repr(exc)
    assert exc.field == field
    assert field in str(exc) and "allowed" in str(exc) and exc.allowed


def assert_untouched(server: Any) -> None:
    assert mutations(server) == [], [(r.method, r.path) for r in mutations(server)]
    assert desired(server, "ray", NAME) == 1


# ----- backend API -----


@pytest.mark.parametrize("replicas", BAD_REPLICAS, ids=repr)
def test_backend_refuses_bad_replicas(make_scaler, scaler_server, cluster, replicas):
    backend = make_scaler()
    with pytest.raises(InvalidInputError) as caught:
        backend.scale(cluster, replicas, wait=False)
    assert_invalid(caught.value, "replicas")
    assert "integer from 0 to" in caught.value.allowed
    with pytest.raises(InvalidInputError):
        backend.claim(cluster, "phase-a", replicas)
    assert_untouched(scaler_server)
    assert backend.get_baseline(cluster) is None


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=repr)
def test_backend_refuses_bad_timeouts(make_scaler, scaler_server, cluster, timeout):
    backend = make_scaler()
    for call in (
        lambda: backend.scale(cluster, 3, timeout=timeout),
        lambda: backend.wait_for_workers(cluster, 3, timeout=timeout),
        lambda: backend.restart_head(cluster, timeout=timeout),
        lambda: backend.restore_baseline(cluster, timeout=timeout),
    ):
        with pytest.raises(InvalidInputError) as caught:
            call()
        assert_invalid(caught.value, "timeout")
        assert "positive number of seconds" in caught.value.allowed
    assert_untouched(scaler_server)


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_invalid_kubernetes_names_are_refused(name):
    with pytest.raises(InvalidInputError) as caught:
        ClusterRef("ray", name)
    assert_invalid(caught.value, "name")
    assert "DNS-1123" in caught.value.allowed


@pytest.mark.parametrize("kind", BAD_KINDS, ids=repr)
def test_unknown_kinds_are_refused(kind):
    with pytest.raises(InvalidInputError) as caught:
        ClusterRef(kind, "x")
    assert_invalid(caught.value, "kind")
    for allowed in ("ray", "spark", "dask", "mpi"):
        assert allowed in caught.value.allowed


def test_mpi_is_refused_by_the_scaler_backend_before_any_request(make_scaler, scaler_server, cluster):
    backend = make_scaler()
    with pytest.raises(UnsupportedOperationError) as caught:
        backend.scale(ClusterRef("mpi", "mpi-x"), 2)
    assert "ray, spark, dask" in str(caught.value) or "dask, ray, spark" in str(caught.value)
    assert scaler_server.requests == []


@pytest.mark.parametrize("tier", ["", "   ", 7, True], ids=repr)
def test_empty_or_non_text_tier_is_refused(make_scaler, scaler_server, cluster, tier):
    backend = make_scaler()
    with pytest.raises(InvalidInputError) as caught:
        backend.scale(cluster, 3, tier, wait=False)
    assert_invalid(caught.value, "worker_hw_tier")
    assert_untouched(scaler_server)


@pytest.mark.parametrize("tier", ["No Such Tier", "Spark Only"], ids=["unknown", "restricted-to-spark"])
def test_unknown_or_restricted_tier_changes_nothing(make_scaler, scaler_server, cluster, tier):
    backend = make_scaler()
    with pytest.raises(UnknownTierError) as caught:
        backend.scale(cluster, 3, tier, wait=False)
    assert tier in str(caught.value)
    assert all(r.status == 400 for r in mutations(scaler_server))
    assert desired(scaler_server, "ray", NAME) == 1


@pytest.mark.parametrize("tier", ["No Such Tier", "Spark Only"], ids=["unknown", "restricted-to-spark"])
def test_unknown_or_restricted_tier_is_refused_before_any_patch(make_scaler, scaler_server, cluster, tier):
    backend = make_scaler(nucleus_url=scaler_server.url)  # the test server also plays Nucleus /v4/hardwareTier
    with pytest.raises(UnknownTierError) as caught:
        backend.scale(cluster, 3, tier, wait=False)
    assert "Small" in str(caught.value) and "Medium" in str(caught.value)
    assert_untouched(scaler_server)


def test_foreign_cluster_is_refused_and_unchanged(make_scaler, scaler_server, cluster):
    backend = make_scaler()
    with pytest.raises(ScalingError) as caught:
        backend.scale(ClusterRef("ray", "ray-foreign"), 3, wait=False)
    assert caught.value.code == "unauthorized"
    assert scaler_server.count("PATCH") == 0  # refused on the read before the patch
    assert desired(scaler_server, "ray", "ray-foreign") == 1


def test_strict_above_max_is_refused_before_any_patch(make_scaler, scaler_server, cluster):
    backend = make_scaler()
    with pytest.raises(ScalingError) as caught:
        backend.scale(cluster, 7, strict=True, wait=False)
    assert caught.value.code == "capacity_exceeded" and "maxReplicas is 6" in str(caught.value)
    assert_untouched(scaler_server)


# ----- Flyte surfaces -----


@pytest.mark.parametrize(
    "config, field",
    [
        (dict(replicas=-1), "replicas"),
        (dict(replicas=True), "replicas"),
        (dict(replicas=2.5), "replicas"),
        (dict(timeout=0), "timeout"),
        (dict(worker_hw_tier=""), "worker_hw_tier"),
        (dict(cluster="ray/Not_Valid"), "name"),
        (dict(cluster="kube/x"), "kind"),
    ],
    ids=["neg", "bool", "float", "timeout0", "emptytier", "badname", "badkind"],
)
def test_task_and_phase_definitions_refuse_bad_config(scaler_server, config: Dict[str, Any], field: str):
    from flytekitplugins_ddlscale import ScaleCluster, distributed_phase

    args: Dict[str, Any] = dict(cluster=f"ray/{NAME}", replicas=2)
    args.update(config)
    with pytest.raises(InvalidInputError) as task_error:
        ScaleCluster("bad_scale", **args)
    with pytest.raises(InvalidInputError) as phase_error:
        distributed_phase(**args)
    for caught in (task_error, phase_error):
        assert_invalid(caught.value, field)
    assert scaler_server.requests == []


@pytest.mark.parametrize("replicas", [-1, 10**6], ids=repr)
def test_task_run_time_inputs_are_checked_before_any_request(scaler_env, scaler_server, cluster, replicas):
    from flytekit import workflow

    from flytekitplugins_ddlscale import ScaleCluster

    scale = ScaleCluster("rel_scale_bad_input", cluster=f"ray/{NAME}", replicas=2, timeout=10)

    @workflow
    def wf(n: int) -> None:
        scale(replicas=n)

    with pytest.raises(Exception) as caught:
        wf(n=replicas)
    text = str(caught.value)
    assert "replicas" in text and "allowed" in text and "integer from 0 to" in text
    assert scaler_server.requests == []


# ----- CLI -----


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"--replicas": "-1"}, "replicas"),
        ({"--replicas": "5000"}, "replicas"),
        ({"--timeout": "0"}, "timeout"),
        ({"--timeout": "nan"}, "timeout"),
        ({"--worker-hw-tier": ""}, "worker_hw_tier"),
        ({"--kind": "kube"}, "kind"),
        ({"--name": "Bad_Name"}, "name"),
    ],
    ids=["neg", "huge", "timeout0", "timeout-nan", "emptytier", "kind", "name"],
)
def test_cli_refuses_bad_input_with_exit_code_2(scaler_env, scaler_server, cluster, overrides, field):
    from flytekitplugins_ddlscale.cli import main

    options = {"--kind": "ray", "--name": NAME, "--replicas": "3", **overrides}
    argv = ["scale"] + [part for pair in options.items() for part in pair]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert field in result.output and "allowed" in result.output
    assert_untouched(scaler_server)


def test_cli_non_integer_replicas_is_a_usage_error(scaler_env, scaler_server, cluster):
    from flytekitplugins_ddlscale.cli import main

    result = CliRunner().invoke(main, ["scale", "--kind", "ray", "--name", NAME, "--replicas", "2.5"])
    assert result.exit_code == 2
    assert "replicas" in result.output
    assert_untouched(scaler_server)



@pytest.mark.parametrize(
    "argv, field",
    [
        (["restore", "--replicas", "-1"], "replicas"),
        (["restore", "--replicas", "2", "--worker-hw-tier", " "], "worker_hw_tier"),
        (["restart-head", "--timeout", "0"], "timeout"),
        (["restart-head", "--head-hw-tier", ""], "head_hw_tier"),
        (["status", "--wait", "--timeout", "-1"], "timeout"),
    ],
    ids=["restore-neg", "restore-blank-tier", "restart-timeout0", "restart-empty-tier", "status-timeout"],
)
def test_other_cli_commands_refuse_bad_input_before_any_change(scaler_env, scaler_server, cluster, argv, field):
    from flytekitplugins_ddlscale.cli import main

    result = CliRunner().invoke(main, [argv[0], "--kind", "ray", "--name", NAME, *argv[1:]])
    assert result.exit_code == 2, result.output
    assert field in result.output and "allowed" in result.output
    assert_untouched(scaler_server)
