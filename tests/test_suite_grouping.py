"""The README's test command keeps a module that shares a module-scoped fixture in one pytest-xdist worker
(its clusters start once), runs the tests that start Ray nodes or Spark JVMs one after another in one worker,
and spreads every other test over the workers (tests/conftest.py).

The rules are checked on the real test modules by collecting them in this process (which group
tests/conftest.py gives each test), and pytest-xdist's keeping of those groups by one real
``-n 3 --dist loadgroup`` run of a few tiny sample modules under the same conftest.
"""
import os
import re
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parent.parent
LANE = "ray-or-spark"
SAMPLE_CONFTEST = 'pytest_plugins = ["tests.conftest"]  # the suite\'s own grouping rules\n'


class _Groups:
    """Records, for each test collected, the xdist group tests/conftest.py gave it."""

    def __init__(self) -> None:
        self.of: Dict[str, str] = {}

    @pytest.hookimpl(trylast=True)  # after the conftest's hook, which adds the groups
    def pytest_collection_modifyitems(self, items) -> None:
        self.of = {item.nodeid: item.get_closest_marker("xdist_group").args[0] for item in items}


def _collect(args: List[str]) -> tuple:
    """Collect ``args`` in this process (no test runs); return (exit code, {node id: xdist group})."""
    groups = _Groups()
    code = pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider", *args], plugins=[groups])
    return code, groups.of


def _groups_of(*modules: str) -> Dict[str, str]:
    code, groups = _collect(["--rootdir", str(ROOT), "-c", str(ROOT / "pytest.ini"), *(str(ROOT / m) for m in modules)])
    assert code == 0 and groups, f"collecting {modules} failed (exit {code})"
    return groups


def _in(groups: Dict[str, str], module: str) -> Dict[str, str]:
    return {node: group for node, group in groups.items() if node.startswith(module + "::")}


def test_each_test_that_starts_ray_or_spark_runs_in_the_one_lane_and_dask_tests_stay_out():
    """A Ray head started beside other Ray or Spark work times out on two cores: each test that starts Ray nodes
    carries ``starts_ray``, each that starts Spark JVMs ``starts_spark``, and both run in one lane."""
    groups = _groups_of("tests/test_local_ray.py", "tests/test_local_spark.py", "tests/test_local_security.py",
                        "tests/test_benchmarks_smoke.py", "tests/test_examples.py")
    assert set(_in(groups, "tests/test_local_ray.py").values()) == {LANE}
    assert set(_in(groups, "tests/test_local_spark.py").values()) == {LANE}
    security = _in(groups, "tests/test_local_security.py")
    by_kind = defaultdict(set)
    for node, group in security.items():
        if node.endswith("]"):  # on the module's cluster of one kind
            by_kind[node.rsplit("[", 1)[1].rstrip("]")].add(group)
    # The Dask cluster of the module is shared by its Dask tests (one worker), out of both lanes.
    assert dict(by_kind) == {"ray": {LANE}, "spark": {LANE}, "dask": {"tests/test_local_security.py"}}
    assert all(group == node for node, group in security.items() if not node.endswith("]"))
    lanes = {node.rsplit("[", 1)[1].rstrip("]"): group
             for node, group in _in(groups, "tests/test_benchmarks_smoke.py").items() if group == LANE}
    assert lanes == {"local_frameworks": LANE, "local_spark": LANE}
    examples = {node.split("::")[1]: group for node, group in _in(groups, "tests/test_examples.py").items()
                if group == LANE}
    assert examples == {"test_readme_ray_snippet_is_the_ray_example_and_runs_end_to_end_on_local_ray": LANE,
                        "test_spark_example_runs_locally_end_to_end_on_a_real_spark_cluster": LANE}


def test_a_module_sharing_a_fixture_is_one_group_and_other_tests_are_groups_of_their_own():
    groups = _groups_of("tests/test_local_flow.py", "tests/test_core_refs.py")
    assert set(_in(groups, "tests/test_local_flow.py").values()) == {"tests/test_local_flow.py"}  # module-scoped loop
    plain = _in(groups, "tests/test_core_refs.py")
    assert len(plain) > 1 and all(group == node for node, group in plain.items())


def test_an_envtest_module_with_a_control_plane_of_its_own_is_its_own_group_beside_the_shared_one():
    own, shared = "tests/envtest/test_envtest_connector_faults.py", "tests/envtest/test_envtest_floor.py"
    groups = _groups_of(own, shared)
    assert set(_in(groups, own).values()) == {own} and len(_in(groups, own)) == 2
    # The floor module's real-server cases share the session's control plane (its test-server cases run anywhere).
    real = {node: group for node, group in _in(groups, shared).items() if "[api-server]" in node}
    assert real and set(real.values()) == {"envtest"}, real


def _write_sample(folder: Path, files: Dict[str, str]) -> None:
    (folder / "conftest.py").write_text(SAMPLE_CONFTEST)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))


SAMPLE = {
    "test_shared.py": """
        import pytest

        @pytest.fixture(scope="module")
        def cluster():
            return object()

        @pytest.mark.parametrize("n", range(4))
        def test_shares(cluster, n):
            pass
    """,
    "test_plain.py": """
        import os
        import pathlib
        import time

        import pytest

        STARTED = pathlib.Path(__file__).with_name("plain-started")

        @pytest.mark.parametrize("n", range(9))
        def test_plain(n):
            # Each plain test waits (60 s at most) until a second worker has started one too, so one quick
            # worker cannot take them all before the others are up: spread tests meet, grouped ones never could.
            STARTED.mkdir(exist_ok=True)
            (STARTED / os.environ["PYTEST_XDIST_WORKER"]).touch()
            deadline = time.monotonic() + 60
            while len(list(STARTED.iterdir())) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
    """,
    "test_ray.py": """
        import pytest

        pytestmark = pytest.mark.starts_ray

        @pytest.mark.parametrize("n", range(3))
        def test_ray(n):
            pass
    """,
    "test_spark.py": """
        import pytest

        pytestmark = pytest.mark.starts_spark

        @pytest.mark.parametrize("n", range(3))
        def test_spark(n):
            pass
    """,
}


def test_under_the_readme_command_each_group_runs_in_one_worker_and_the_rest_are_spread(tmp_path):
    _write_sample(tmp_path, SAMPLE)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-c", str(ROOT / "pytest.ini"), str(tmp_path)],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    workers = defaultdict(set)
    for worker, test in re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED (test_\w+\.py::\w+)\[", result.stdout):
        workers[test].add(worker)
    assert set(workers) == {"test_shared.py::test_shares", "test_plain.py::test_plain", "test_ray.py::test_ray",
                            "test_spark.py::test_spark"}, result.stdout[-3000:]
    assert len(workers["test_shared.py::test_shares"]) == 1, dict(workers)
    assert len(workers["test_ray.py::test_ray"] | workers["test_spark.py::test_spark"]) == 1, dict(workers)
    assert len(workers["test_plain.py::test_plain"]) > 1, dict(workers)
