"""``ddlscale local up|down|status|list`` against real local clusters."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from flytekitplugins_ddlscale.backends.local import LocalBackend
from flytekitplugins_ddlscale.cli.local_commands import local
from flytekitplugins_ddlscale.refs import ClusterRef
from tests.test_local_support import local_state, processes_mentioning, scheduler_workers, wait_dead  # noqa: F401


def _invoke(state, *args):
    return CliRunner().invoke(local, ["--state-dir", str(state.parent), *args])


@pytest.mark.slow
def test_up_list_status_repair_down(local_state):
    result = _invoke(local_state, "up", "--name", "cli", "--workers", "2", "--tier", "Medium", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert (info["ready_workers"], info["worker_hw_tier"], info["status"]) == (2, "Medium", "Running")
    assert info["env"]["DASK_SCHEDULER_SERVICE_PORT"] == info["address"].rsplit(":", 1)[1]
    assert {w["nthreads"] for w in scheduler_workers(info["address"], Path(info["tls_ca_file"]).parent.parent).values()} == {2}

    listed = _invoke(local_state, "list", "--json")
    assert [c["name"] for c in json.loads(listed.stdout)] == ["cli"]
    text = _invoke(local_state, "list").stdout
    assert text.splitlines()[1].split()[:4] == ["dask", "cli", "Running", "2/2"]

    victim = LocalBackend(state_dir=local_state).store.load(ClusterRef("dask", "cli")).workers[1]
    os.kill(victim.proc.pid, signal.SIGKILL)
    wait_dead(victim.proc)
    report = json.loads(_invoke(local_state, "status", "--name", "cli", "--no-repair", "--json").stdout)
    assert (report["status"], report["existing_workers"], report["repaired"]) == ("Starting", 1, False)
    repaired = _invoke(local_state, "status", "--name", "cli", "--repair", "--json")
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
        (["up", "--name", "c", "--replicas", "-1"], 2, "invalid replicas=-1"),
        (["up", "--name", "c", "--worker-hw-tier", "Huge"], 2, "allowed for dask: Large, Medium, Small"),
        (["up", "--kind", "mpi", "--name", "c"], 2,
         "[invalid_input] invalid kind='mpi': the local backend runs dask, ray and spark clusters, not mpi"),
        (["up", "--kind", "foo", "--name", "c"], 2, "[invalid_input] invalid kind='foo'; allowed: ray, spark, dask,"),
        (["up", "--kind", "daks", "--name", "c"], 2, "invalid kind='daks': closest allowed value: 'dask'"),
        (["up", "--name", "c", "--tier", "Mediun"], 2, "allowed for dask: Large, Medium, Small; closest: 'Medium'"),
        (["status", "--kind", "ray", "--name", "nope"], 4, "`ddlscale local up --kind ray --name nope`"),
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
    assert result.stderr.splitlines()[-1].startswith("Error: ")  # as click and the cluster commands print it
    assert LocalBackend(state_dir=local_state).list_clusters() == []
    assert processes_mentioning(str(local_state)) == []


def test_down_all_with_nothing_running(local_state):
    result = _invoke(local_state, "down", "--all")
    assert result.exit_code == 0 and result.stdout == "stopped 0 clusters\n"


@pytest.mark.slow
def test_up_with_the_scale_option_names_and_kind(local_state):
    result = _invoke(local_state, "up", "--kind", "dask", "--name", "same", "--replicas", "1",
                     "--worker-hw-tier", "Small", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert (info["ready_workers"], info["worker_hw_tier"]) == (1, "Small")
    down = _invoke(local_state, "down", "--kind", "dask", "--name", "same")
    assert down.exit_code == 0 and "stopped dask/same" in down.stdout


def test_list_columns_line_up_under_the_header():
    from flytekitplugins_ddlscale.cli.local_commands import _table

    infos = [
        {"kind": "dask", "name": "a", "status": "Running", "ready_workers": 1, "desired_workers": 1,
         "worker_hw_tier": "Small", "address": "tcp://127.0.0.1:1"},
        {"kind": "spark", "name": "a-much-longer-name", "status": "Starting", "ready_workers": 10, "desired_workers": 12,
         "worker_hw_tier": "Medium", "address": "tcp://127.0.0.1:40000"},
        {"kind": "ray", "name": "b", "status": "Failed", "ready_workers": 0, "desired_workers": 2,
         "worker_hw_tier": None, "address": "tcp://127.0.0.1:2"},
    ]
    lines = _table(infos).splitlines()
    assert lines[0].split() == ["KIND", "NAME", "STATUS", "READY/DESIRED", "TIER", "SCHEDULER"]
    for header in ("NAME", "STATUS", "READY/DESIRED", "TIER", "SCHEDULER"):
        column = lines[0].index(header)
        assert all(line[column - 2:column] == "  " and line[column] != " " for line in lines[1:]), header
    assert lines[3].split()[:2] == ["ray", "b"] and lines[3].split()[3:5] == ["0/2", "-"]


@pytest.mark.slow
def test_a_cluster_whose_new_workers_have_not_joined_is_starting_not_stopping(local_state):
    from flytekitplugins_ddlscale.backends.local import _procs as procs
    from flytekitplugins_ddlscale.backends.local._state import WorkerRecord

    assert _invoke(local_state, "up", "--name", "grow", "--replicas", "1").exit_code == 0
    backend = LocalBackend(state_dir=local_state)
    ref = ClusterRef("dask", "grow")
    # What another process sees while a scale-up runs: a new worker process is
    # recorded (and running) before it has joined and before `desired` is raised. It carries the cluster's
    # mark, as every process the cluster starts does (a record naming an unmarked process is refused).
    mark = procs.Mark.of(backend.store.cluster_dir(ref))
    joining = subprocess.Popen(["sleep", "60"], env={**os.environ, procs.CLUSTER_MARK_ENV: mark.path})
    try:
        record = backend.store.load(ref)
        record.workers.append(WorkerRecord("grow-dask-worker-9", procs.ProcessId(joining.pid, procs.start_time(joining.pid)),
                                           record.worker_hw_tier, 1, 2**30))
        backend.store.save(record)
        report = json.loads(_invoke(local_state, "status", "--name", "grow", "--no-repair", "--json").stdout)
        assert (report["status"], report["existing_workers"], report["desired_workers"]) == ("Starting", 2, 1)
        # Surplus workers that have joined are on their way out: that is Stopping.
        record = backend.store.load(ref)
        record.workers.pop()
        record.desired = 0
        backend.store.save(record)
        report = json.loads(_invoke(local_state, "status", "--name", "grow", "--no-repair", "--json").stdout)
        assert (report["status"], report["existing_workers"], report["desired_workers"]) == ("Stopping", 1, 0)
    finally:
        joining.kill()
        joining.wait()


def test_plural():
    from flytekitplugins_ddlscale._core.progress import plural

    assert [plural(0, "worker"), plural(1, "worker"), plural(2, "cluster")] == ["0 workers", "1 worker", "2 clusters"]


@pytest.mark.parametrize("command", ["status", "restore"])
def test_status_and_restore_of_a_missing_local_cluster_both_exit_4(command, tmp_path):
    from flytekitplugins_ddlscale.cli import main

    result = CliRunner().invoke(
        main, [command, "--backend", "local", "--kind", "dask", "--name", "never-made"],
        env={"DDLSCALE_STATE_DIR": str(tmp_path / "state")}, catch_exceptions=False,
    )
    assert result.exit_code == 4, result.output
    assert "[not_found] dask/never-made: no local cluster dask/never-made" in result.stderr
    assert LocalBackend(state_dir=tmp_path / "state" / "local").list_clusters() == []


def _files_under(folder) -> list:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if not path.is_dir())


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--backend", "local", "--kind", "dask", "--name", "typo-status"],
        ["restore", "--backend", "local", "--kind", "dask", "--name", "typo-restore"],
        ["run", "--backend", "local", "--kind", "dask", "--name", "typo-run", "--replicas", "0", "--", "true"],
        ["local", "down", "--name", "typo-down"],
        ["local", "status", "--name", "typo-local-status"],
    ],
    ids=lambda args: " ".join(args[:1] + args[1:2]),
)
def test_a_cluster_that_never_existed_leaves_no_file(args, tmp_path):
    from flytekitplugins_ddlscale.cli import main

    state = tmp_path / "state"
    CliRunner().invoke(main, args, env={"DDLSCALE_STATE_DIR": str(state)}, catch_exceptions=False)
    assert _files_under(state) == []
    assert not list((state / "local" / "clusters").iterdir())


def test_a_cluster_taken_down_leaves_no_folder(local_state):
    up = _invoke(local_state, "up", "--name", "gone-soon", "--replicas", "1")
    assert up.exit_code == 0, up.output
    assert _invoke(local_state, "down", "--name", "gone-soon").exit_code == 0
    assert list((local_state / "clusters").iterdir()) == []
    assert _files_under(local_state / "records") == []


def test_state_dir_means_what_the_environment_means_on_the_group_and_on_each_command(local_state):
    from flytekitplugins_ddlscale.cli import main

    state = str(local_state.parent)
    up = CliRunner().invoke(main, ["local", "up", "--state-dir", state, "--name", "here", "--replicas", "1"])
    assert up.exit_code == 0, up.output
    try:
        seen = CliRunner().invoke(main, ["status", "--backend", "local", "--kind", "dask", "--name", "here"],
                                  env={"DDLSCALE_STATE_DIR": state})
        assert seen.exit_code == 0 and "desired=1" in seen.output, seen.output
        listed = CliRunner().invoke(main, ["local", "--state-dir", "/nowhere", "list", "--state-dir", state])
        assert listed.exit_code == 0 and "here" in listed.output, listed.output
    finally:
        assert CliRunner().invoke(main, ["local", "down", "--state-dir", state, "--name", "here"]).exit_code == 0


def _cluster_command(local_state, *args):
    from flytekitplugins_ddlscale.cli import main

    return CliRunner().invoke(main, list(args), env={"DDLSCALE_STATE_DIR": str(local_state.parent)})


@pytest.mark.parametrize(
    "args",
    [
        ["scale", "--kind", "dask", "--replicas", "1", "--no-wait"],
        ["scale", "--kind", "ray", "--replicas", "1", "--no-wait"],
        ["scale", "--kind", "dask", "--replicas", "2"],
        ["restore", "--kind", "dask", "--replicas", "1", "--no-wait"],
        ["restore", "--kind", "dask"],
        ["run", "--kind", "dask", "--replicas", "1", "--", "true"],
    ],
)
def test_a_mistyped_cluster_name_starts_nothing(local_state, args):
    command, kind = args[0], args[2]
    result = _cluster_command(local_state, command, "--backend", "local", "--name", "does-not-exist", *args[1:])
    assert result.exit_code == 4, result.output
    assert f"[not_found] {kind}/does-not-exist: no local cluster" in result.stderr
    assert f"`ddlscale local up --kind {kind} --name does-not-exist`" in result.stderr
    assert ("add --create" in result.stderr) == (command != "restore")  # restore never creates
    assert LocalBackend(state_dir=local_state).list_clusters() == []
    assert processes_mentioning(str(local_state)) == []


@pytest.mark.slow
def test_scale_creates_a_cluster_when_asked_and_its_restore_removes_it(local_state):
    # Kind and tier matched without case, as the local tiers file spells them.
    created = _cluster_command(local_state, "scale", "--backend", "local", "--kind", "DASK", "--name", "asked",
                               "--replicas", "1", "--worker-hw-tier", "small", "--create", "--json")
    assert created.exit_code == 0, created.output
    body = json.loads(created.stdout)
    assert (body["final"]["ready_workers"], body["final"]["worker_hw_tier"], body["worker_hw_tier"]) == (1, "Small", "Small")
    assert LocalBackend(state_dir=local_state).list_clusters() == [ClusterRef("dask", "asked")]
    restored = _cluster_command(local_state, "restore", "--backend", "local", "--kind", "dask", "--name", "asked")
    assert restored.exit_code == 0, restored.output
    assert LocalBackend(state_dir=local_state).list_clusters() == []  # the scale created it: the restore removes it
    assert processes_mentioning(str(local_state)) == []


def test_the_cli_logs_bare_lines_as_flows_print_them(local_state):
    ddlscale = str(Path(sys.executable).with_name("ddlscale"))
    env = {**os.environ, "DDLSCALE_STATE_DIR": str(local_state.parent)}
    created = subprocess.run([ddlscale, "local", "up", "--name", "plain", "--replicas", "0"], env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stderr
    waits = [line for line in created.stderr.splitlines() if "waiting for 0 workers" in line]
    assert waits and all(line.startswith("waiting for 0 workers seen by the Dask scheduler") for line in waits)
    assert "INFO" not in created.stderr


def test_up_help_lists_each_option_once_and_an_option_with_its_older_name_is_refused(local_state):
    text = _invoke(local_state, "up", "--help").output
    assert "--replicas INTEGER" in text and "--workers" not in text and "--tier " not in text
    both = _invoke(local_state, "up", "--name", "c", "--replicas", "1", "--workers", "2")
    assert both.exit_code == 2 and "give --replicas or its older name --workers, not both" in both.stderr
    assert LocalBackend(state_dir=local_state).list_clusters() == []
