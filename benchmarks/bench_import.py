"""Import cost of the plugin on top of flytekit, in fresh interpreters.

flytekit imports every ``flytekit.plugins`` entry point at the end of
``import flytekit``, so "``import flytekit`` then ``import
flytekitplugins_ddlscale``" measures nothing: the plugin is already loaded.
Two fair measurements, both in fresh subprocesses, interleaved so that
machine noise hits both sides alike:

* ``marginal``: the plugin's entry point is neutralised (placeholder modules
  for the package and its entry module, ``connector_entry``, sit in
  ``sys.modules`` while ``import flytekit`` runs), then the placeholders are
  dropped and the entry module (which registers the four connectors) is
  imported the way flytekit's entry-point loader does it,
  ``importlib.import_module``, timed alone (the package root first, so the
  registration's own share is reported too). That is
  exactly what the plugin adds to flytekit's start-up (its modules and
  anything only it imports). This is the figure the target is judged on.
  (``python -X importtime`` cannot give it: its timing sits in the C import
  path, which ``importlib.import_module`` bypasses, so the plugin's own line
  is missing from that report.)
* ``paired``: wall time of ``import flytekit`` as installed, minus the same
  with the plugin's entry point neutralised. The difference confirms the
  first figure end-to-end but is noisier: it is the difference of two ~1.5 s
  figures.

The marginal run also lists the modules the plugin's import brings in, and checks that no backend
library (kubernetes, httpx, dask, distributed, ray) is among them.

A third interpreter per round imports the ``ddlscale`` command line, which
holds the phase machinery of ``ddlscale run`` (``hold/``), and counts the
flytekit modules that came with it: none, since no surface imports another.
"""
import subprocess
import sys
from pathlib import Path
from typing import List, Set, Tuple

from benchmarks.report import BenchResult, Target
from benchmarks.stats import summarize

NAME = "import_time"
TITLE = "import flytekitplugins_ddlscale over import flytekit"
PLUGIN = "flytekitplugins_ddlscale"
ENTRY = "flytekitplugins_ddlscale.connector_entry"  # the flytekit.plugins entry point: registers the four task types
HEAVY = ("kubernetes", "httpx", "dask", "distributed", "ray")
LIMIT_MS = 100.0

_WITH = "import time; t=time.perf_counter(); import flytekit; print(time.perf_counter()-t)"
_NEUTRALISE = f"sys.modules.update({{m: types.ModuleType(m) for m in ({PLUGIN!r}, {ENTRY!r})}})"
_WITHOUT = (
    f"import sys, types, time; {_NEUTRALISE}; "
    "t=time.perf_counter(); import flytekit; print(time.perf_counter()-t)"
)
_MARGINAL = (
    f"import importlib, sys, types, time; {_NEUTRALISE}; "
    f"import flytekit; del sys.modules[{PLUGIN!r}], sys.modules[{ENTRY!r}]; before = set(sys.modules); "
    f"t=time.perf_counter(); importlib.import_module({PLUGIN!r}); r=time.perf_counter(); "
    f"importlib.import_module({ENTRY!r}); e=time.perf_counter(); print(e-t, e-r); "
    "print(' '.join(sorted(set(sys.modules) - before)))"
)
_CLI = (
    "import sys, time; t=time.perf_counter(); import flytekitplugins_ddlscale.cli; print(time.perf_counter()-t); "
    "print(sum(1 for m in sys.modules if m.split('.')[0] == 'flytekit'))"
)


def _python(code: str, *flags: str) -> Tuple[str, str]:
    proc = subprocess.run(
        [sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return proc.stdout, proc.stderr


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Measure the plugin's import cost both ways over ``1`` (quick) or ``10`` rounds."""
    rounds = 1 if quick else 10
    marginal: List[float] = []
    registrations: List[float] = []  # the entry module on top of the package root: the connector registration
    with_times: List[float] = []
    added: Set[str] = set()
    without_times: List[float] = []
    cli_times: List[float] = []
    cli_flytekit = 0
    for i in range(rounds):
        # Alternate the order inside each round so a slow stretch of the machine hits both sides.
        order = (_WITH, _WITHOUT) if i % 2 == 0 else (_WITHOUT, _WITH)
        for code in order:
            out, _ = _python(code)
            (with_times if code is _WITH else without_times).append(float(out.strip()) * 1000.0)
        out, _ = _python(_MARGINAL)
        elapsed, _, modules = out.partition("\n")
        whole, registration = elapsed.split()
        marginal.append(float(whole) * 1000.0)
        registrations.append(float(registration) * 1000.0)
        added = set(modules.split())  # the same in every round: the plugin's import is deterministic
        out, _ = _python(_CLI)
        elapsed, _, count = out.partition("\n")
        cli_times.append(float(elapsed) * 1000.0)
        cli_flytekit = max(cli_flytekit, int(count))
    paired = [w - wo for w, wo in zip(with_times, without_times)]
    heavy = sorted(m for m in added if m.split(".")[0] in HEAVY)
    result = BenchResult(NAME, TITLE)
    result.metrics = {
        "rounds": rounds,
        "plugin_marginal_import_ms": summarize(marginal, 2),
        "connector_registration_ms": summarize(registrations, 2),
        "import_flytekit_with_plugin_ms": summarize(with_times, 1),
        "import_flytekit_plugin_neutralised_ms": summarize(without_times, 1),
        "paired_difference_ms": summarize(paired, 1),
        "modules_added_by_plugin": len(added),
        "backend_libraries_imported": heavy,
        "ddlscale_cli_import_ms": summarize(cli_times, 1),
        "flytekit_modules_imported_by_ddlscale_cli": cli_flytekit,
        "headline": [
            f"import flytekit: {summarize(with_times, 0)['median']:.0f} ms median; the plugin adds "
            f"{summarize(marginal, 1)['median']} ms (marginal import; registering the connectors "
            f"{summarize(registrations, 1)['median']} ms of it), {len(added)} modules, backends not loaded; "
            f"paired wall-time cross-check median {summarize(paired, 0)['median']:.0f} ms but spread "
            f"{summarize(paired, 0)['min']:.0f}..{summarize(paired, 0)['max']:.0f} ms (noise of two full imports)"
            if not heavy else f"backend libraries imported eagerly: {', '.join(heavy)}"
        ],
    }
    stats = summarize(marginal, 2)
    result.targets.append(
        Target("plugin import over flytekit (median, marginal import after flytekit)", stats["median"], LIMIT_MS, "ms",
               detail=f"p95 {stats['p95']} ms; {rounds} fresh interpreter(s) per variant")
    )
    result.targets.append(
        Target("backend libraries imported by the plugin at flytekit start-up", float(len(heavy)), 0.0, "modules",
               detail=", ".join(heavy) or "none of " + ", ".join(HEAVY))
    )
    result.targets.append(
        Target("flytekit modules imported by the ddlscale CLI and its phase machinery", float(cli_flytekit), 0.0,
               "modules", detail=f"CLI import {summarize(cli_times, 0)['median']:.0f} ms median")
    )
    return result

