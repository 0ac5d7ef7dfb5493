"""The package's five bands (docs/architecture.md), read from its own imports.

From the top: the user-facing surfaces (``tasks/``, ``phase/``, ``cli/``, the
flytekit connector, the workflow helpers, ``flyte2/``), the services they share
(``_services/``: holding a cluster for a block, running a node, opening a
backend, readiness, the connector service), the backends (``backends/``, their
helpers under ``backends/_support/``), the framework probes (``_framework/``)
and the core (``errors``, ``models``, ``refs``, ``_core/``). A module imports
only from its own band or those below it; surfaces stand side by side (none
imports another); no two modules import each other, directly or round a longer
circle. Every import statement counts, also those inside functions or under
``TYPE_CHECKING``.
"""
import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import flytekitplugins_ddlscale

PACKAGE = "flytekitplugins_ddlscale"
ROOT = Path(flytekitplugins_ddlscale.__file__).parent
SURFACES = ("tasks", "phase", "cli", "connector", "connector_entry", "workflow_helpers", "flyte2")
# The band of each top-level name below the package; a higher number sits higher.
BANDS = {
    **{surface: 5 for surface in SURFACES},
    "_services": 4,
    "backends": 3,
    "_framework": 2,
    "_core": 1,
    "errors": 1,
    "models": 1,
    "refs": 1,
}
BAND_NAMES = {5: "surfaces", 4: "services", 3: "backends", 2: "framework", 1: "core"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool) -> Iterator[Tuple[int, str]]:
    """(line, absolute module) of every import in ``source``, the module of ``from x import name`` included."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            # `from . import cli` imports the module named by the alias.
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def surface_of(module: str) -> Optional[str]:
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    return parts[1] if parts[1] in SURFACES else None


def violations(source: str, module: str, is_package: bool = False) -> List[str]:
    """Imports in ``source`` (of ``module``) that cross from one surface into another, or from below into one."""
    own = surface_of(module)
    found = []
    for line, target in imported_modules(source, module, is_package):
        other = surface_of(target)
        if other is not None and other != own:
            found.append(f"{module}:{line} imports {target} ({own or 'core'} -> {other})")
    return found


def band_of(module: str) -> int:
    """The band ``module`` belongs to; the package root is a facade over every band."""
    parts = module.split(".")
    if len(parts) == 1:
        return max(BANDS.values())
    if parts[1] not in BANDS:
        raise AssertionError(f"{module} belongs to no band: add {parts[1]!r} to BANDS and to docs/architecture.md")
    return BANDS[parts[1]]


def package_imports() -> Dict[str, Set[str]]:
    """Every package module and the package modules it imports (a name imported from a module counts as the module)."""
    modules = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}
    graph: Dict[str, Set[str]] = {}
    for module, path in modules.items():
        graph[module] = set()
        by_line: Dict[int, Set[str]] = {}
        for line, target in imported_modules(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                by_line.setdefault(line, set()).add(target)
        for targets in by_line.values():
            # `from . import procs` names the module procs, not its package's facade.
            graph[module] |= {t for t in targets if not any(other.startswith(t + ".") for other in targets)}
    return graph


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    return [
        f"{module} ({BAND_NAMES[band_of(module)]}) imports {target} ({BAND_NAMES[band_of(target)]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if band_of(target) > band_of(module)
    ]


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Groups of modules that reach each other through imports (Tarjan's strongly connected components)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_a_band_above_its_own():
    assert upward_imports(package_imports()) == []


def test_no_modules_import_each_other_round_a_circle():
    # A package imports its own modules (its facade), and its modules may import
    # siblings through it only by name, never back into the facade.
    assert circles(package_imports()) == []


def test_the_band_checks_find_an_upward_import_and_a_circle():
    graph = {
        f"{PACKAGE}._core.waiting": {f"{PACKAGE}.backends.base"},
        f"{PACKAGE}.backends.base": {f"{PACKAGE}._core.waiting"},
        f"{PACKAGE}._services.opening": {f"{PACKAGE}.backends.base"},
    }
    assert upward_imports(graph) == [f"{PACKAGE}._core.waiting (core) imports {PACKAGE}.backends.base (backends)"]
    assert circles(graph) == [[f"{PACKAGE}._core.waiting", f"{PACKAGE}.backends.base"]]


def test_every_module_belongs_to_a_band():
    for module in package_imports():
        band_of(module)


def test_no_module_imports_a_surface_other_than_its_own():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        found += violations(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")
    assert found == []


def test_the_check_finds_crossings_in_every_import_form():
    module = f"{PACKAGE}.phase.run"
    assert violations("from ..tasks.runner import observed_workers\n", module) == [
        f"{module}:1 imports {PACKAGE}.tasks.runner (phase -> tasks)",
        f"{module}:1 imports {PACKAGE}.tasks.runner.observed_workers (phase -> tasks)",
    ]
    assert violations("def f():\n    from .. import connector\n", module)[-1].endswith("(phase -> connector)")
    assert violations(f"import {PACKAGE}.cli.output\n", f"{PACKAGE}.refs") == [
        f"{PACKAGE}.refs:1 imports {PACKAGE}.cli.output (core -> cli)"
    ]
    assert violations("from .settings import PhaseSettings\nfrom ..refs import parse_cluster\n", module) == []
    assert violations("from .base import X\n", f"{PACKAGE}.tasks", is_package=True) == []


def test_the_command_line_and_the_phase_machinery_load_without_flytekit():
    script = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from flytekitplugins_ddlscale.cli import main\n"
        "import flytekitplugins_ddlscale.phase, flytekitplugins_ddlscale._services.hold\n"
        "for args in (['--help'], ['run', '--help']):\n"
        "    assert CliRunner().invoke(main, args).exit_code == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'flytekit'))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_flyte2_surface_loads_neither_flyte_nor_flytekit_until_a_node_or_phase_is_defined():
    script = (
        "import sys\n"
        "import flytekitplugins_ddlscale.flyte2\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'flyte', 'flytekit'}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
