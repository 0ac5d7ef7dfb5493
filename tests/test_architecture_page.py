"""docs/architecture.md names every module of the package, so a module added or renamed shows on the page."""
import re
from pathlib import Path

import flytekitplugins_ddlscale

ROOT = Path(flytekitplugins_ddlscale.__file__).parent
PAGE = ROOT.parent / "docs" / "architecture.md"


def unnamed_modules(page: str) -> list:
    """The package's modules whose name (with or without its leading underscore and ``.py``) the page never uses."""
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        stem = re.escape(path.stem.lstrip("_"))
        if not re.search(rf"(?<!\w)_?{stem}(\.py)?(?!\w)", page):
            missing.append(str(path.relative_to(ROOT)))
    return missing


def test_the_architecture_page_names_every_module():
    assert unnamed_modules(PAGE.read_text(encoding="utf-8")) == []


def test_a_module_the_page_does_not_name_is_found():
    page = PAGE.read_text(encoding="utf-8")
    assert unnamed_modules(re.sub(r"(?<!\w)_?fieldchecks(\.py)?(?!\w)", "", page)) == ["_core/fieldchecks.py"]
