"""The README's test command runs each module in one pytest-xdist worker (module-scoped clusters start once)."""
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_each_module_runs_in_one_worker_under_loadgroup():
    files = ["tests/test_core_refs.py", "tests/test_core_waiting.py", "tests/test_core_redaction.py"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", *files],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    workers = defaultdict(set)
    for worker, path in re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED (tests/[\w/]+\.py)::", result.stdout):
        workers[path].add(worker)
    assert set(workers) == set(files), result.stdout[-3000:]
    assert all(len(ran_in) == 1 for ran_in in workers.values()), dict(workers)
