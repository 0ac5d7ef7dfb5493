"""``ddlscale status|scale|restart-head|restore`` against the scaler test server: output and exit codes."""
import json

import pytest
from click.testing import CliRunner

from flytekitplugins_ddlscale.cli import main
from tests.servers.scaler_server import DEFAULT_API_KEY, OTHER_API_KEY


@pytest.fixture
def run(scaler_server, tmp_path):
    """Invoke the CLI with the scaler backend pointed at the test server."""

    def invoke(*args, api_key=DEFAULT_API_KEY, base_url=None, **env):
        environment = {
            "CLUSTER_SCALER_BASE_URL": base_url or scaler_server.url,
            "DOMINO_API_KEY": api_key,
            "DDLSCALE_STATE_DIR": str(tmp_path / "state"),
            "DDLSCALE_BACKEND": "scaler",
            "DOMINO_API_PROXY": None,
            "DOMINO_TOKEN": None,
            "DOMINO_RUN_ID": None,
            "DOMINO_API_HOST": None,
        }
        environment.update(env)
        return CliRunner().invoke(main, list(args), env=environment, catch_exceptions=False)

    return invoke


def test_status_json(scaler_server, run):
    scaler_server.add_cluster("ray", "ray-run1", replicas=2, max_replicas=5)
    result = run("status", "--kind", "ray", "--name", "ray-run1", "--json")
    assert result.exit_code == 0
    state = json.loads(result.stdout)
    assert (state["desired_workers"], state["existing_workers"], state["ready_workers"]) == (2, 2, None)
    assert state["autoscaling_max"] == 5 and state["cluster"] == "ray/ray-run1"


def test_status_text_and_run_id(scaler_server, run):
    scaler_server.add_cluster("dask", "dask-abc123", replicas=1)
    result = run("status", "--kind", "daskclusters", "--run-id", "ABC123")
    assert result.exit_code == 0
    assert "dask/dask-abc123 Running: desired=1 existing=1 ready=?" in result.stdout
    from_env = run("status", "--kind", "dask", DOMINO_RUN_ID="abc123")
    assert from_env.exit_code == 0


def test_status_wait(scaler_server, run):
    scaler_server.add_cluster("ray", "ray-run1", replicas=2)
    assert run("status", "--kind", "ray", "--name", "ray-run1", "--wait", "--timeout", "5").exit_code == 0


def test_missing_cluster_identity_is_bad_input(run):
    result = run("status", "--kind", "ray")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: [invalid_input]")
    assert "give --name (or --run-id) outside a Domino run" in result.stderr


def test_restore_tier_without_replicas_is_refused(scaler_server, run):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=3)
    assert run("scale", "--kind", "ray", "--name", "ray-run1", "--replicas", "2", "--timeout", "10").exit_code == 0
    result = run("restore", "--kind", "ray", "--name", "ray-run1", "--worker-hw-tier", "Medium")
    assert result.exit_code == 2
    assert "invalid worker_hw_tier='Medium'" in result.stderr and "only together with --replicas N" in result.stderr
    assert scaler_server.count("PATCH") == 1  # only the scale: the restore changed nothing
    assert scaler_server.cluster_object("ray", "ray-run1")["spec"]["worker"]["replicas"] == 2
    assert run("restore", "--kind", "ray", "--name", "ray-run1", "--timeout", "10").exit_code == 0  # baseline kept


EXIT_CODES = (
    "3 timeout; 4 not found (a local cluster is created only by `ddlscale local up` or --create); "
    "5 unauthorized; 6 backend unavailable (or, with --fail-on-fault, a cluster "
    "fault during the command); 8 state directory not writable (read only or full disk); "
    "130 interrupted (Ctrl-C); 1 other errors"
)


def _help(*command):
    # Wide enough that no value is hyphenated across lines.
    result = CliRunner().invoke(main, [*command, "--help"], terminal_width=200, max_content_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_the_group_help_lists_the_exit_codes_and_no_subcommand_repeats_them():
    assert _help().count(EXIT_CODES) == 1
    for command in (["scale"], ["status"], ["restart-head"], ["restore"], ["run"], ["local"], ["local", "up"]):
        assert "Exit codes: 0 ok" not in _help(*command), command
    run_help = _help("run")
    assert "the command's (128 + N when signal N ended it" in run_help and "`ddlscale --help`" in run_help


@pytest.mark.parametrize("command", [["scale"], ["status"], ["restart-head"], ["restore"], ["run"]])
def test_kind_help_lists_each_kind_once_without_aliases(command):
    text = _help(*command)
    assert "Cluster kind: ray, spark, dask, mpi, kuberay, dask-operator (any case)." in text
    assert "clusters," not in text.split("--kind", 1)[1].split("--name", 1)[0]  # no plural aliases


def test_scale_json_and_restore(scaler_server, run):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=3)
    result = run("scale", "--kind", "ray", "--name", "ray-run1", "--replicas", "5", "--json", "--timeout", "10")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert (body["requested"], body["effective"], body["capped"], body["waited"]) == (5, 3, True, True)
    assert body["previous"]["desired_workers"] == 1 and body["final"]["existing_workers"] == 3
    restored = run("restore", "--kind", "ray", "--name", "ray-run1", "--json", "--timeout", "10")
    assert restored.exit_code == 0 and json.loads(restored.stdout)["effective"] == 1
    again = run("restore", "--kind", "ray", "--name", "ray-run1")
    assert again.exit_code == 2 and "no baseline" in again.stderr


def test_restore_to_explicit_replicas(scaler_server, run):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1)
    result = run("restore", "--kind", "ray", "--name", "ray-run1", "--replicas", "2", "--no-wait")
    assert result.exit_code == 0 and "set 2" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--replicas", "-1"],
        ["--replicas", "2", "--worker-hw-tier", "Nope"],
        ["--replicas", "9", "--strict"],
        ["--replicas", "2", "--timeout", "0"],
        ["--replicas", "two"],
    ],
)
def test_scale_bad_input_exits_2(scaler_server, run, args):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=3)
    result = run("scale", "--kind", "ray", "--name", "ray-run1", *args)
    assert result.exit_code == 2
    assert scaler_server.cluster_object("ray", "ray-run1")["spec"]["worker"]["replicas"] == 1
    # Only a tier name needs the service's catalog to be judged; everything else is refused locally.
    assert scaler_server.count("PATCH") == (1 if "--worker-hw-tier" in args else 0)


def test_bad_kind_and_backend_exit_2(scaler_server, run):
    assert run("status", "--kind", "flink", "--name", "x").exit_code == 2
    assert run("status", "--kind", "ray", "--name", "x", "--backend", "bogus").exit_code == 2
    assert scaler_server.requests == []


def test_not_found_exits_4_with_json_error(run):
    result = run("status", "--kind", "spark", "--name", "spark-missing", "--json")
    assert result.exit_code == 4
    assert json.loads(result.stdout)["error"] == "not_found"


def test_unauthorized_exits_5_without_echoing_credentials(scaler_server, run):
    scaler_server.add_cluster("ray", "ray-run1")
    result = run("scale", "--kind", "ray", "--name", "ray-run1", "--replicas", "2", api_key=OTHER_API_KEY)
    assert result.exit_code == 5
    assert OTHER_API_KEY not in result.output


def test_unavailable_exits_6(run):
    result = run("status", "--kind", "ray", "--name", "ray-run1", "--json", base_url="http://127.0.0.1:9")
    assert result.exit_code == 6 and json.loads(result.stdout)["error"] == "backend_unavailable"


@pytest.mark.parametrize("wait", ["--wait", "--no-wait"])
def test_scale_on_a_service_never_reached_exits_6_at_once(run, wait):
    # Riding this out as an outage would end in exit 3 after --timeout.
    result = run("scale", "--kind", "ray", "--name", "ray-run1", "--replicas", "3", wait, "--timeout", "20", "--json",
                 base_url="http://127.0.0.1:9")
    assert result.exit_code == 6, result.stdout
    error = json.loads(result.stdout)
    assert error["error"] == "backend_unavailable" and "has not answered once" in error["message"]


def test_timeout_exits_3_with_last_state(scaler_server, run):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, pod_ready_delay=30)
    result = run("scale", "--kind", "ray", "--name", "ray-run1", "--replicas", "3", "--timeout", "0.5", "--json")
    assert result.exit_code == 3
    error = json.loads(result.stdout)
    assert error["error"] == "timeout" and error["state"]["existing_workers"] == 1


def test_restart_head(scaler_server, run):
    scaler_server.head_recreate_delay = 0.1
    scaler_server.head_ready_delay = 0.1
    scaler_server.add_cluster("ray", "ray-run1")
    scaler_server.add_cluster("spark", "spark-run1")
    ok = run("restart-head", "--kind", "ray", "--name", "ray-run1", "--json", "--timeout", "10")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["ready"] is True
    spark = run("restart-head", "--kind", "spark", "--name", "spark-run1")
    assert spark.exit_code == 1 and "kubernetes backend" in spark.stderr
    tier = run("restart-head", "--kind", "ray", "--name", "ray-run1", "--head-hw-tier", "Medium")
    assert tier.exit_code == 1 and "head" in tier.stderr


def test_mpi_is_bad_input_for_the_scaler_as_for_every_backend_that_does_not_run_it(run):
    result = run("status", "--kind", "mpi", "--name", "mpi-run1", "--json")
    body = json.loads(result.stdout)
    assert result.exit_code == 2 and body["error"] == "invalid_input"
    assert "the scaler service does not serve mpi clusters" in body["message"]


def test_scale_timeout_exits_3_names_what_was_left_and_the_restore_that_undoes_it(scaler_server, run):
    scaler_server.add_cluster("ray", "ray-run1", replicas=1, max_replicas=5)
    scaler_server.set_pod_ready_delay(1.0)
    result = run("scale", "--kind", "ray", "--name", "ray-run1", "--replicas", "3", "--timeout", "0.3", "--json")
    assert result.exit_code == 3
    body = json.loads(result.stdout)
    assert body["error"] == "timeout" and body["left_in_place"] == "spec.worker.replicas=3"
    # This shell already points at the service and the state directory, so the command needs nothing more.
    assert body["remedy_command"] == "ddlscale restore --backend scaler --kind ray --name ray-run1"
    assert body["remedy_call"] == 'get_backend("scaler").restore_baseline(ClusterRef("ray", "ray-run1"))'
    assert scaler_server.cluster_object("ray", "ray-run1")["spec"]["worker"]["replicas"] == 3
    restored = run(*body["remedy_command"].split()[1:], "--timeout", "20")
    assert restored.exit_code == 0, restored.output
    assert scaler_server.cluster_object("ray", "ray-run1")["spec"]["worker"]["replicas"] == 1
