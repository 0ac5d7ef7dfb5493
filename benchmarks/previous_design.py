"""Run a benchmark child process on the plugin as it was before the shared informer and polls.

The comparison "one watch (or poll loop) per wait" is measured on the real previous code, not on an
option kept in the plugin: :func:`export` writes the package and ``benchmarks/`` of commit
:data:`PREVIOUS` (from this repository's git history) to a directory, and :func:`command` runs a
module from there. The venv's editable install of the current tree is a ``sys.meta_path`` finder,
which would win over ``sys.path``; the launcher removes it first.
"""
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Tuple

PREVIOUS = "1156fdb"
"""The last commit before issue 14 (one pod watch per wait, one poll loop per scaler wait)."""
REPO_ROOT = Path(__file__).resolve().parents[1]
_LAUNCH = (
    "import sys, runpy; "
    "sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, '__module__', '').startswith('__editable__')]; "
    "sys.path.insert(0, sys.argv.pop(1)); "
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
)


HARNESS = ("fleet_connector_client.py", "fleet_wait_client.py", "fleet_scaler_client.py")
"""Benchmark child harnesses newer than :data:`PREVIOUS`, copied in: the code measured is the old plugin."""


def export(target: Path) -> Tuple[Optional[Path], str]:
    """The previous design's source tree under ``target`` (created once), with this tree's
    :data:`HARNESS`; (None, why) where the git history is not there (a copy without ``.git``)."""
    if not (target / "flytekitplugins_ddlscale").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        try:
            archive = subprocess.run(
                ["git", "-C", str(REPO_ROOT), "archive", PREVIOUS, "flytekitplugins_ddlscale", "benchmarks"],
                capture_output=True, check=True,
            ).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            return None, f"previous design not measured: git archive {PREVIOUS} failed ({detail.decode(errors='replace').strip() or exc})"
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        for name in HARNESS:
            (target / "benchmarks" / name).write_text((REPO_ROOT / "benchmarks" / name).read_text())
        # The venv's flytekit.plugins entry point names this tree's entry module; the previous design's
        # entry point was the package itself, which importing this empty module loads.
        (target / "flytekitplugins_ddlscale" / "connector_entry.py").write_text(
            '"""The previous design\'s flytekit.plugins entry point was the package itself."""\n')
    return target, ""


def command(tree: Path, module: str, *args: str) -> List[str]:
    """``python -m module args`` importing the plugin and benchmarks from ``tree``."""
    return [sys.executable, "-c", _LAUNCH, str(tree), module, *args]
