"""The configuration the deployment guide tells users to write, read from the guide's own pages (docs/*.md).

A fenced YAML block of a page is a *guide block* named NAME when the line right before its opening fence is the
HTML comment ``<!-- guide: NAME -->`` (NAME: lower-case letters, digits and dashes, unique in its page);
Markdown renderers show the block and hide the comment. For example, in docs/sandbox.md::

    <!-- guide: sandbox-extra-config -->
    ```yaml
    plugins: ...
    ```

* ``guide_yaml(page, name)``: the block's YAML, parsed (a new object on every call: change it freely);
* ``guide_text(page, name)``: the block's text as a user copies it (the fence's indentation removed);
* ``guide_blocks(page)``: every named block of the page, ``{name: GuideBlock}``;
* ``yaml_fences(page)``: every ```yaml fence of the page, named or not, in page order.

``page`` is a page of docs/ (``"sandbox.md"``) or a path. A marker not followed by a ```yaml fence, a name used
twice, an unknown name or a block that is not YAML raises :class:`GuideError`, naming the page and the line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import yaml

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARKER = re.compile(r"^\s*<!--\s*guide:\s*(?P<name>[a-z0-9][a-z0-9-]*)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")


class GuideError(ValueError):
    """A guide page whose blocks cannot be read as the convention says (one line: the page, the line, why)."""


@dataclass(frozen=True)
class GuideBlock:
    """One fenced YAML block: its marker's name (None when unmarked), the page, the fence's 1-based line, its text."""

    name: Optional[str]
    page: Path
    line: int
    text: str

    def parsed(self) -> Any:
        try:
            return yaml.safe_load(self.text)
        except yaml.YAMLError as error:
            raise GuideError(f"{self.page.name}:{self.line}: guide block {self.name!r} is not YAML: "
                             f"{str(error).splitlines()[0]}") from None


def _path(page: Union[str, Path]) -> Path:
    path = Path(page)
    return path if path.is_absolute() or path.exists() else DOCS / path


def _scan(page: Union[str, Path]) -> List[GuideBlock]:
    """Every ```yaml fence of ``page`` in order, each with the name of the marker right before it (or None)."""
    path = _path(page)
    lines = path.read_text().splitlines()
    blocks: List[GuideBlock] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            if MARKER.match(lines[index]) and not (index + 1 < len(lines) and FENCE.match(lines[index + 1])):
                raise GuideError(f"{path.name}:{index + 1}: a guide marker must be the line right before a "
                                 "```yaml fence")
            index += 1
            continue
        indent, ticks = opening.group("indent"), opening.group("ticks")
        end = index + 1
        while end < len(lines) and not re.match(rf"^\s*{re.escape(ticks[0])}{{{len(ticks)},}}\s*$", lines[end]):
            end += 1
        marker = MARKER.match(lines[index - 1]) if index else None
        is_yaml = opening.group("info").lower() in ("yaml", "yml")
        if marker and not is_yaml:
            raise GuideError(f"{path.name}:{index}: the marker of guide block {marker.group('name')!r} is followed "
                             f"by a {opening.group('info') or 'plain'} fence, not ```yaml")
        if is_yaml:
            body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[index + 1:end]]
            blocks.append(GuideBlock(marker.group("name") if marker else None, path, index + 1,
                                     "\n".join(body) + "\n"))
        index = end + 1
    return blocks


def yaml_fences(page: Union[str, Path]) -> List[GuideBlock]:
    """Every ```yaml fence of ``page``, named or not, in page order."""
    return _scan(page)


def guide_blocks(page: Union[str, Path]) -> Dict[str, GuideBlock]:
    """The named blocks of ``page``: ``{name: GuideBlock}``, in page order."""
    named: Dict[str, GuideBlock] = {}
    for block in _scan(page):
        if block.name is None:
            continue
        if block.name in named:
            raise GuideError(f"{block.page.name}:{block.line}: guide block {block.name!r} is named twice "
                             f"(first at line {named[block.name].line})")
        named[block.name] = block
    return named


def _block(page: Union[str, Path], name: str) -> GuideBlock:
    blocks = guide_blocks(page)
    if name not in blocks:
        raise GuideError(f"{_path(page).name}: no guide block {name!r}; the page names: "
                         f"{', '.join(blocks) or 'none'}")
    return blocks[name]


def guide_text(page: Union[str, Path], name: str) -> str:
    """The text of guide block ``name`` of ``page``, as a user copies it."""
    return _block(page, name).text


def guide_yaml(page: Union[str, Path], name: str) -> Any:
    """The YAML of guide block ``name`` of ``page``, parsed."""
    return _block(page, name).parsed()
