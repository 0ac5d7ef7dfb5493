"""Smoke test of the benchmark suite: every benchmark runs in quick mode and writes a well-formed result.

Timings are not asserted (the machine is shared); what is checked is that
each benchmark ran (status ``ok``), produced figures for every target, wrote
valid JSON and its plots, and left no threads or processes behind. The
real-server variants (``*_envtest``) are in the envtest tier: they run on the
tier's session control plane, lent to them, so the tier starts no second one.
"""
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from benchmarks.report import RESULT_SCHEMA
from benchmarks import real_k8s
from benchmarks.run import BENCHMARKS, SERVER, main, run_one
from tests.flyte_support import processes_mentioning

SLOW = {"import_time", "scaler_lag", "readiness_lag", "k8s_lag", "k8s_200", "task_overhead", "local_dask", "outage",
        "local_spark", "local_frameworks",
        "fleet_k8s", "fleet_scaler", "concurrency", "flyte_propeller", *SERVER}
NO_JAVA = pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="Java is absent: local Spark clusters need Java 17+ (apt-get install openjdk-17-jre-headless)",
)
RAY = {"local_frameworks"}
"""Benchmarks that start Ray nodes (marked ``starts_ray``: conftest.py runs them in the Ray-or-Spark lane)."""
SPARK = {"local_spark"}
"""Benchmarks that start Spark JVMs (marked ``starts_spark``: conftest.py runs them in the Ray-or-Spark lane)."""
NEEDS = {"local_spark": [NO_JAVA], "flyte_propeller": [pytest.mark.flyte],
         **{name: [pytest.mark.envtest] for name in SERVER}}


def _non_daemon_threads():
    return {t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()}


def _check_document(doc, out_dir, name):
    jsonschema.validate(doc, RESULT_SCHEMA)
    assert doc["benchmark"] == name and doc["quick"] is True
    assert doc["status"] == "ok", doc.get("reason")
    assert doc["metrics"], "no metrics recorded"
    for target in doc["targets"]:
        assert target["value"] is not None, f"{target['name']} was not measured: {target['detail']}"
        assert isinstance(target["met"], bool)
    for path in doc["files"]:
        assert (out_dir / path).stat().st_size > 0
    assert json.loads((out_dir / f"{name}.json").read_text()) == doc


def _check_counted_from_the_audit_log(doc):
    """On the real server the client's requests and watches are read from the API server's audit log."""
    from benchmarks import bench_fleet

    assert doc["metrics"]["plan"]["server"] == "envtest"
    assert "backend_shared" in doc["metrics"] and "backend_per_wait" not in doc["metrics"]
    clusters = bench_fleet.QUICK.clusters
    backend = doc["metrics"]["backend_shared"]
    assert backend["completed"] == clusters and backend["error_count"] == 0
    # Every wait shares one pod watch and one watch of the cluster objects; the requests counted are the
    # client's own (one accepted PATCH per cluster, and one more for each 409 the DCO stand-in's status
    # writes cause; the kubelet's and the stand-in's writes are not the audited user's).
    assert backend["peak_watches_per_resource"] == 1 and backend["requests"]["pod_watches"] >= 1
    assert backend["requests"]["patches"] == clusters
    assert backend["ready_write_ms"]["n"] >= clusters
    # Once every execution has polled, the connector answers from its caches: no read of a cluster object
    # or of pods reaches the API server (its informers' watches may be re-opened).
    after = doc["metrics"]["connector_shared"]["after_first_polls"]
    assert after["polls"] > 0
    assert after["requests"]["cluster_gets"] == 0 and after["requests"]["pod_lists"] == 0, after


def _check_split_at_the_cache(doc):
    """Each connector answer's lag is split where the client's pod cache first held the Ready workers."""
    from benchmarks import bench_fleet

    lane = doc["metrics"]["connector_shared"]
    assert lane["answer_after_cache_ms"]["n"] == lane["to_cache_ms"]["n"] == bench_fleet.QUICK.clusters
    # Each answering poll's CPU (the loop's thread, the process) and its path (on the loop, or waited).
    assert lane["answer_cpu_ms"]["loop"]["n"] == lane["answer_cpu_ms"]["process"]["n"] == bench_fleet.QUICK.clusters
    assert sum(path["n"] for path in lane["answer_after_cache_by_path_ms"].values()) == bench_fleet.QUICK.clusters
    assert any(t["name"].startswith("connector_shared: lag after the pod cache") for t in doc["targets"])


def _check_raw_polls(doc, out_dir):
    """The shared connector lane keeps every execution's polls beside the result, the answering one last."""
    import gzip

    from benchmarks import bench_fleet

    (raw_name,) = [f for f in doc["files"] if f.endswith("_polls.json.gz")]
    with gzip.open(out_dir / raw_name, "rt") as raw_file:
        raw = json.load(raw_file)
    assert len(raw["executions"]) == bench_fleet.QUICK.clusters
    for execution in raw["executions"]:
        assert execution["polls"] and execution["polls"][-1][2] == 1.0
        assert all(len(poll) == len(raw["polls_are"]) and poll[0] <= poll[1] for poll in execution["polls"])
        assert execution["cached"] is not None and execution["ready"] > 0


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.slow] * (n in SLOW) + [pytest.mark.starts_ray] * (n in RAY)
                        + [pytest.mark.starts_spark] * (n in SPARK) + NEEDS.get(n, []))
        for n in BENCHMARKS
    ],
)
def test_benchmark_runs_quick_and_writes_a_well_formed_result(name, tmp_path, monkeypatch, request):
    lent = real_k8s.lend(request.getfixturevalue("envtest")) if name in SERVER else contextlib.nullcontext()
    # The benchmark's temporary folders go under this test's own folder, so the leftover check below sees
    # only this benchmark's processes (another worker may be running another benchmark meanwhile). Ray's
    # socket paths do not fit there: the Ray benchmark keeps the temp folder and runs alone (its lane, where
    # no other test starts anything under the temp folder's ddlscale-bench- folders).
    private_tmp = tmp_path / "benchtmp"
    private_tmp.mkdir()
    shared_tmp = name in RAY
    if not shared_tmp:
        monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    threads_before = _non_daemon_threads()
    with lent:
        doc = run_one(name, quick=True, out_dir=tmp_path)
    _check_document(doc, tmp_path, name)
    if name == "fleet_k8s_envtest":
        _check_counted_from_the_audit_log(doc)
    if name in ("fleet_k8s", "fleet_k8s_envtest"):
        _check_split_at_the_cache(doc)
        _check_raw_polls(doc, tmp_path)
    deadline = time.monotonic() + 10
    while _non_daemon_threads() - threads_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _non_daemon_threads() - threads_before, "benchmark left threads running"
    own = str(Path(tempfile.gettempdir()) / "ddlscale-bench-") if shared_tmp else str(private_tmp)
    assert not processes_mentioning(own), "benchmark left processes running"


def test_cost_model_reports_each_strategy_and_plots(tmp_path):
    doc = run_one("cost_model", quick=True, out_dir=tmp_path)
    busy = next(iter(doc["metrics"]["scenarios"].values()))
    assert set(busy) == {"kept_at_max", "cpu_heuristic", "plugin"}
    for row in busy.values():
        assert row["gpu_worker_hours"] >= 0 and len(row["minutes_to_full_size"]) == 2
    pytest.importorskip("matplotlib")
    assert (tmp_path / "cost_model.png").stat().st_size > 0


@pytest.mark.parametrize("name", sorted(SERVER))
def test_a_real_server_variant_without_the_binaries_is_skipped_saying_what_to_set(name, tmp_path, monkeypatch):
    monkeypatch.delenv("DDLSCALE_ENVTEST_DIR", raising=False)
    doc = run_one(name, quick=True, out_dir=tmp_path)
    assert doc["status"] == "skipped" and doc["benchmark"] == name
    assert "DDLSCALE_ENVTEST_DIR is not set" in doc["reason"] and "set DDLSCALE_ENVTEST_DIR=" in doc["reason"]


def test_an_unknown_server_choice_is_refused_naming_the_choices(tmp_path):
    from benchmarks import bench_fleet, bench_k8s

    for module in (bench_k8s, bench_fleet):
        with pytest.raises(ValueError, match="server must be one of test-server, envtest"):
            module.run(quick=True, out_dir=tmp_path, server="kind")


def test_a_fleet_run_of_an_unknown_path_is_refused_naming_the_paths(tmp_path):
    from benchmarks import bench_fleet

    with pytest.raises(ValueError, match="paths must be some of backend, connector"):
        bench_fleet.run(quick=True, out_dir=tmp_path, paths=("operator",))


def test_runner_writes_summary_covering_existing_results(tmp_path, capsys):
    assert main(["--quick", "--only", "cost_model", "--out", str(tmp_path)]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "cost_model (quick)" in summary and "--quick" in summary
    assert "cost_model" in capsys.readouterr().out


def test_unknown_benchmark_name_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        main(["--only", "no_such_benchmark", "--out", str(tmp_path)])
