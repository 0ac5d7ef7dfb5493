"""docs/architecture.md names every module of the package, so a module added or renamed shows on the page."""
import re
from pathlib import Path

import flytekitplugins_ddlscale

ROOT = Path(flytekitplugins_ddlscale.__file__).parent
PAGE = ROOT.parent / "docs" / "architecture.md"


def unnamed_modules(page: str) -> list:
    """The package's modules whose name, spelt as the file is (leading underscore and all; ``.py`` optional),
    the page never uses: a search for the file must find it."""
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        stem = re.escape(path.stem)
        if not re.search(rf"(?<!\w){stem}(\.py)?(?!\w)", page):
            missing.append(str(path.relative_to(ROOT)))
    return missing


def test_the_architecture_page_names_every_module():
    assert unnamed_modules(PAGE.read_text(encoding="utf-8")) == []


def test_a_module_the_page_does_not_name_is_found():
    page = PAGE.read_text(encoding="utf-8")
    assert unnamed_modules(re.sub(r"(?<!\w)_?peerowner(\.py)?(?!\w)", "", page)) == ["_core/peerowner.py"]


def test_a_module_named_without_its_underscore_is_not_named():
    page = PAGE.read_text(encoding="utf-8")
    assert unnamed_modules(re.sub(r"(?<!\w)_informer(\.py)?(?!\w)", "informer.py", page)) == [
        "backends/kubernetes/_informer.py"
    ]
