"""The user-facing surfaces stand side by side: none imports another, and the core imports none.

Surfaces: the Flyte task types (``tasks/``), ``@distributed_phase``
(``phase/``), the command line (``cli/``), the Flyte connector, the
workflow helpers and the Flyte 2 surface (``flyte2/``). What they share lives below them (``refs``, ``timeline``,
``environ``, ``opening``, ``nodes/``, ``hold/``, ...). Every import
statement counts, also those inside functions or under ``TYPE_CHECKING``.
"""
import ast
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import flytekitplugins_ddlscale

PACKAGE = "flytekitplugins_ddlscale"
ROOT = Path(flytekitplugins_ddlscale.__file__).parent
SURFACES = ("tasks", "phase", "cli", "connector", "workflow_helpers", "flyte2")


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
        "import flytekitplugins_ddlscale.phase, flytekitplugins_ddlscale.hold\n"
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
