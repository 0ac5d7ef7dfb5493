"""``ddlscale local up|down|status|list`` against real local clusters."""
import json
import os
import signal

import pytest
from click.testing import CliRunner

from flytekitplugins_ddlscale.backends.local import LocalBackend
from flytekitplugins_ddlscale.cli.local_commands import local
from flytekitplugins_ddlscale.refs import ClusterRef
from tests.test_local_support import local_state, processes_mentioning, scheduler_workers, wait_dead  # noqa: F401


def _invoke(state, *args):
    return CliRunner().invoke(local, ["--state-dir", str(state), *args])


@pytest.mark.slow
def test_up_list_status_repair_down(local_state):
    result = _invoke(local_state, "up", "--name", "cli", "--workers", "2", "--tier", "Medium", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert (info["ready_workers"], info["worker_hw_tier"], info["status"]) == (2, "Medium", "Running")
    assert info["env"]["DASK_SCHEDULER_SERVICE_PORT"] == info["address"].rsplit(":", 1)[1]
    assert {w["nthreads"] for w in scheduler_workers(info["address"]).values()} == {2}

    listed = _invoke(local_state, "list", "--json")
    assert [c["name"] for c in json.loads(listed.stdout)] == ["cli"]
    text = _invoke(local_state, "list").stdout
    assert "cli" in text and "Running" in text and "2/2" in text

    victim = LocalBackend(state_dir=local_state).store.load(ClusterRef("dask", "cli")).workers[1]
    os.kill(victim.proc.pid, signal.SIGKILL)
    wait_dead(victim.proc)
    report = json.loads(_invoke(local_state, "status", "--name", "cli", "--no-repair", "--json").stdout)
    assert (report["status"], report["existing_workers"], report["repaired"]) == ("Starting", 1, False)
    repaired = _invoke(local_state, "status", "--name", "cli", "--json")
    assert repaired.exit_code == 0, repaired.output
    report = json.loads(repaired.stdout)
    assert (report["status"], report["ready_workers"], report["repaired"]) == ("Running", 2, True)
    assert victim.proc.pid not in [w["pid"] for w in report["workers"]]

    down = _invoke(local_state, "down", "--name", "cli")
    assert down.exit_code == 0 and "stopped dask/cli" in down.stdout
    assert _invoke(local_state, "list").stdout.strip() == "no local clusters"
    assert processes_mentioning(str(local_state)) == []


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["up", "--name", "c", "--tier", "Huge"], 2, "allowed for dask: Large, Medium, Small"),
        (["up", "--name", "Bad_Name"], 2, "invalid name='Bad_Name'"),
        (["up", "--name", "c", "--workers", "-1"], 2, "invalid replicas=-1"),
        (["up", "--name", "c", "--timeout", "0"], 2, "invalid timeout=0.0"),
        (["status", "--name", "nope"], 4, "no local cluster dask/nope"),
        (["down", "--name", "nope"], 4, "no local cluster dask/nope"),
        (["down"], 2, "exactly one of --name NAME or --all"),
        (["down", "--name", "c", "--all"], 2, "exactly one of --name NAME or --all"),
    ],
)
def test_bad_input_exit_codes_and_nothing_started(local_state, args, code, message):
    result = _invoke(local_state, *args)
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert LocalBackend(state_dir=local_state).list_clusters() == []
    assert processes_mentioning(str(local_state)) == []


def test_down_all_with_nothing_running(local_state):
    result = _invoke(local_state, "down", "--all")
    assert result.exit_code == 0 and "stopped 0 cluster(s)" in result.stdout
