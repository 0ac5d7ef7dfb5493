"""docs/errors.md's table of every error against the code: the classes, their families, codes,
CLI exit codes and whether they are retried.

The classes are found by reading the package's source (every class whose base is, in turn, a
``ScalingError``), so a new error class that the table does not list fails here.
"""
import ast
import importlib
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

import flytekitplugins_ddlscale
from flytekitplugins_ddlscale.cli.output import exit_code_for
from flytekitplugins_ddlscale.errors import (
    AccessError,
    ClusterStateError,
    InvalidInputError,
    ScalingError,
    ScalingTimeoutError,
    TransientError,
)

PACKAGE = "flytekitplugins_ddlscale"
ROOT = Path(flytekitplugins_ddlscale.__file__).parent
TABLE = ROOT.parent / "docs" / "errors.md"
FAMILIES = {
    InvalidInputError: "bad input",
    ClusterStateError: "cluster state",
    TransientError: "transient",
    ScalingTimeoutError: "timeout",
    AccessError: "access",
}
COLUMNS = ["class", "import from", "family", "code", "CLI exit", "raised when", "retried?"]


def error_classes_in_source() -> Dict[str, str]:
    """Class name -> module (under the package) of every ``ScalingError`` subclass the source defines."""
    defined: List[Tuple[str, str, List[str]]] = []
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        module = module[: -len(".__init__")] if module.endswith(".__init__") else module
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "") for base in node.bases]
                defined.append((node.name, module, bases))
    found = {"ScalingError": "errors"}
    grown = True
    while grown:
        grown = False
        for name, module, bases in defined:
            if name not in found and any(base in found for base in bases):
                found[name] = module
                grown = True
    return found


def table_rows() -> Dict[str, Dict[str, str]]:
    """Class name -> its row of the table under "## Every error"."""
    text = TABLE.read_text().split("## Every error", 1)[1]
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == COLUMNS
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        row = dict(zip(COLUMNS, cells))
        name = row["class"].strip("`")
        assert name not in rows, f"{name} is listed twice"
        rows[name] = row
    return rows


def family_of(cls: type) -> str:
    families = [name for family, name in FAMILIES.items() if issubclass(cls, family)]
    assert len(families) <= 1, f"{cls.__name__} is in more than one family: {families}"
    return families[0] if families else "root"


SOURCE = error_classes_in_source()
ROWS = table_rows()


def load(name: str) -> type:
    return getattr(importlib.import_module(f"{PACKAGE}.{SOURCE[name]}"), name)


def test_every_error_class_is_in_the_table_and_nothing_else():
    assert len(SOURCE) > 20  # the source scan found the classes (guards the scan itself)
    assert sorted(set(SOURCE) - set(ROWS)) == [], "error classes missing from docs/errors.md"
    assert sorted(set(ROWS) - set(SOURCE)) == [], "docs/errors.md lists classes the source does not define"


def mismatches(name: str, row: Dict[str, str]) -> List[str]:
    """How ``row`` of the table differs from class ``name`` in the code (empty when it matches)."""
    cls = load(name)
    where = row["import from"].split()[0].strip("`")
    wrong = []
    if getattr(importlib.import_module(f"{PACKAGE}.{where}"), name, None) is not cls:
        wrong.append(f"not importable from {where}")
    if where == "errors" and getattr(flytekitplugins_ddlscale, name, None) is not cls:
        wrong.append("not importable from the package root")
    expected = {
        "family": family_of(cls),
        "code": f"`{cls.code}`",
        "CLI exit": str(exit_code_for(cls.__new__(cls))),
    }
    wrong += [f"{column} {row[column]} != {value}" for column, value in expected.items() if row[column] != value]
    retried = row["retried?"].split(":")[0].split()[0]
    if retried != ("yes" if issubclass(cls, TransientError) else "no"):
        wrong.append(f"retried? {retried} but transient={issubclass(cls, TransientError)}")
    return wrong


@pytest.mark.parametrize("name", sorted(SOURCE))
def test_the_row_matches_the_class(name):
    assert mismatches(name, ROWS[name]) == []


@pytest.mark.parametrize(
    "column, value",
    [("family", "transient"), ("code", "`not_scalable`"), ("CLI exit", "1"), ("retried?", "yes"),
     ("import from", "`_core.progress`")],
)
def test_a_wrong_row_is_reported(column, value):
    row = dict(ROWS["ClusterNotFoundError"], **{column: value})
    assert mismatches("ClusterNotFoundError", row) != []


def test_the_exit_code_table_lists_every_exit_code_the_cli_uses_once():
    from flytekitplugins_ddlscale.cli import output

    section = TABLE.read_text().split("## CLI exit codes", 1)[1].split("## Every error", 1)[0]
    listed = [line.strip("|").split("|")[0].strip() for line in section.splitlines() if line.startswith("| ")]
    codes = sorted(value for name, value in vars(output).items() if name.startswith("EXIT_") and isinstance(value, int))
    assert listed[0] == "exit" and sorted(map(int, listed[1:])) == codes
    assert len(listed[1:]) == len(set(listed[1:]))
    for code in codes[1:]:
        assert f"{code} " in output.EXIT_CODES_HELP  # and `ddlscale --help` says the same
