"""Run the benchmark suite and write its results.

``python -m benchmarks [--quick] [--only NAME ...] [--out DIR]``

Each benchmark runs in turn (they measure latency, so they do not compete
with each other for the two cores); a benchmark that cannot run (a component
missing) is recorded as skipped, one that fails as an error, and the rest go
on. Results: ``<out>/<name>.json`` per benchmark and ``<out>/summary.md``.
"""
import argparse
import importlib
import json
import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    # tests/servers (the protocol-true test servers) are imported as ``tests.servers``.
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.report import BenchResult, summary_markdown, write_json  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results"

BENCHMARKS: Dict[str, str] = {
    "cost_model": "benchmarks.bench_cost",
    "import_time": "benchmarks.bench_import",
    "scaler_lag": "benchmarks.bench_scaler",
    "readiness_lag": "benchmarks.bench_readiness",
    "k8s_lag": "benchmarks.bench_k8s",
    "k8s_200": "benchmarks.bench_k8s_scale",
    "fleet_k8s": "benchmarks.bench_fleet",
    "fleet_scaler": "benchmarks.bench_fleet_scaler",
    "task_overhead": "benchmarks.bench_overhead",
    "local_dask": "benchmarks.bench_local",
    "local_frameworks": "benchmarks.bench_local_frameworks",
    "local_spark": "benchmarks.bench_local_spark",
    "outage": "benchmarks.bench_outage",
    "concurrency": "benchmarks.bench_concurrency",
    "k8s_lag_envtest": "benchmarks.bench_k8s",
    "fleet_k8s_envtest": "benchmarks.bench_fleet",
    "flyte_propeller": "benchmarks.bench_flyte",
}
"""Benchmark name -> module exposing ``TITLE`` and ``run(quick, out_dir) -> BenchResult``."""
SERVER = {"k8s_lag_envtest": "envtest", "fleet_k8s_envtest": "envtest"}
"""Benchmarks run on another server than their module's default (``run(..., server=)``): the real
kube-apiserver and etcd of the envtest tier (skipped, saying what to set, without ``$DDLSCALE_ENVTEST_DIR``)."""


def run_one(name: str, quick: bool, out_dir: Path) -> Dict:
    """Run benchmark ``name``; write and return its JSON document (never raises for a failing benchmark)."""
    module_name = BENCHMARKS[name]
    started = time.monotonic()
    try:
        module = importlib.import_module(module_name)
        options = {"server": SERVER[name]} if name in SERVER else {}
        result: BenchResult = module.run(quick=quick, out_dir=out_dir, **options)
    except Exception as exc:  # a failing benchmark must not stop the others
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        logging.getLogger("benchmarks").error("%s failed:\n%s", name, traceback.format_exc())
        result = BenchResult(name=name, title=name, status="error", reason=detail)
    document = result.to_json(quick=quick, duration_s=time.monotonic() - started)
    write_json(out_dir / f"{name}.json", document)
    return document


def collect(out_dir: Path) -> List[Dict]:
    """The result documents present in ``out_dir``, in suite order."""
    found = []
    for name in BENCHMARKS:
        path = out_dir / f"{name}.json"
        if path.exists():
            found.append(json.loads(path.read_text(encoding="utf-8")))
    return found


def run_all(names: Sequence[str], quick: bool, out_dir: Path) -> List[Dict]:
    """Run ``names`` in order, write every result and ``summary.md``; return the documents.

    The summary covers every result in ``out_dir``, so ``--only`` refreshes
    one benchmark without dropping the others from the table.
    """
    documents = []
    for name in names:
        print(f"== {name} ...", flush=True)
        doc = run_one(name, quick, out_dir)
        print(f"   {doc['status']} in {doc['duration_s']:.1f}s" + (f": {doc['reason']}" if doc.get("reason") else ""), flush=True)
        for t in doc["targets"]:
            print(f"   - {t['name']}: {t['value']} {t['unit']} (limit {t['comparison']} {t['limit']}) met={t['met']}", flush=True)
        documents.append(doc)
    (out_dir / "summary.md").write_text(summary_markdown(collect(out_dir)), encoding="utf-8")
    return documents


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns 0 unless a benchmark errored."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="minimal repetitions and shortened waits (figures are indicative only)")
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), help="run only this benchmark (repeatable)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results directory (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    names = args.only or list(BENCHMARKS)
    started = time.monotonic()
    documents = run_all(names, args.quick, args.out)
    print(f"total {time.monotonic() - started:.1f}s; results in {args.out}", flush=True)
    return 1 if any(d["status"] == "error" for d in documents) else 0


if __name__ == "__main__":
    sys.exit(main())
