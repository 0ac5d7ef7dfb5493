"""The README's test command keeps a module that shares a module-scoped fixture in one pytest-xdist worker
(its clusters start once) and spreads every other test over the workers."""
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_module_sharing_a_fixture_runs_in_one_worker_and_the_rest_are_spread():
    shared = "tests/test_local_flow.py"  # its flytekit loop fixture is module-scoped
    files = [shared, "tests/test_core_refs.py", "tests/test_core_waiting.py", "tests/test_core_redaction.py"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", *files],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    workers = defaultdict(set)
    for worker, path in re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED (tests/[\w/]+\.py)::", result.stdout):
        workers[path].add(worker)
    assert set(workers) == set(files), result.stdout[-3000:]
    assert len(workers[shared]) == 1, dict(workers)
    assert len(set().union(*(workers[path] for path in files[1:]))) > 1, dict(workers)


def _collected(*args):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    return {line for line in result.stdout.splitlines() if "::" in line}


def test_every_test_that_starts_ray_or_spark_runs_in_the_one_lane():
    """A Ray head started beside another Ray or Spark cluster times out on two cores: each test that starts
    one carries ``ray_or_spark`` (conftest.py puts those in one xdist group); Dask tests stay out of it."""
    assert _collected("-m", "not ray_or_spark", "tests/test_local_ray.py", "tests/test_local_spark.py") == set()
    lane = _collected("-m", "ray_or_spark", "tests/test_local_security.py", "tests/test_benchmarks_smoke.py")
    assert {test.rsplit("[", 1)[1].rstrip("]") for test in lane} == {"ray", "spark", "local_frameworks", "local_spark"}
