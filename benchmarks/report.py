"""The result format every benchmark returns, and how it is written.

A :class:`BenchResult` carries free-form ``metrics`` (JSON-serialisable),
the issue's :class:`Target` checks, notes and produced files. The runner adds
an environment block and writes ``results/<name>.json``; :func:`summary_markdown`
renders the table of every target (docs/benchmarks.md quotes it).
"""
import datetime
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

SCHEMA_VERSION = 1

RESULT_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "required": ["schema_version", "benchmark", "title", "status", "quick", "metrics", "targets", "notes"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "benchmark": {"type": "string", "minLength": 1},
        "title": {"type": "string", "minLength": 1},
        "status": {"enum": ["ok", "skipped", "error"]},
        "reason": {"type": ["string", "null"]},
        "quick": {"type": "boolean"},
        "duration_s": {"type": "number", "minimum": 0},
        "metrics": {"type": "object"},
        "notes": {"type": "array", "items": {"type": "string"}},
        "files": {"type": "array", "items": {"type": "string"}},
        "targets": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "value", "limit", "unit", "met"],
                "properties": {
                    "name": {"type": "string"},
                    "value": {"type": ["number", "null"]},
                    "limit": {"type": ["number", "null"]},
                    "unit": {"type": "string"},
                    "comparison": {"enum": ["<=", ">="]},
                    "met": {"type": ["boolean", "null"]},
                    "detail": {"type": "string"},
                },
            },
        },
    },
}
"""JSON schema of a written result file (used by the smoke test)."""


@dataclass
class Target:
    """One target from the issue: a measured ``value`` against a ``limit``.

    ``met`` is computed from ``comparison``; it is None when ``value`` could
    not be measured (then ``detail`` says why).
    """

    name: str
    value: Optional[float]
    limit: Optional[float]
    unit: str
    comparison: str = "<="
    detail: str = ""
    met: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.comparison not in ("<=", ">="):
            raise ValueError(f"comparison must be '<=' or '>=', not {self.comparison!r}")
        if self.value is not None and self.limit is not None:
            if self.comparison == "<=":
                self.met = self.value <= self.limit
            else:
                self.met = self.value >= self.limit


@dataclass
class BenchResult:
    """What one benchmark measured."""

    name: str
    title: str
    status: str = "ok"
    """``ok``; ``skipped`` when a component it measures is not available; ``error``."""
    reason: Optional[str] = None
    metrics: Dict[str, Any] = field(default_factory=dict)
    targets: List[Target] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    files: List[str] = field(default_factory=list)
    """Paths (relative to the results directory) of the files it wrote beside its result: plots, raw data."""

    @classmethod
    def skipped(cls, name: str, title: str, reason: str) -> "BenchResult":
        """A result saying the benchmark could not run, and why."""
        return cls(name=name, title=title, status="skipped", reason=reason)

    def to_json(self, quick: bool, duration_s: float) -> Dict[str, Any]:
        """The JSON document written to ``results/<name>.json``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "benchmark": self.name,
            "title": self.title,
            "status": self.status,
            "reason": self.reason,
            "quick": quick,
            "duration_s": round(duration_s, 3),
            "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "environment": environment(),
            "metrics": self.metrics,
            "targets": [asdict(t) for t in self.targets],
            "notes": list(self.notes),
            "files": list(self.files),
        }


def environment() -> Dict[str, Any]:
    """Where the run happened: Python, platform, cores and load (the machine is shared)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "loadavg_1_5_15": load,
    }


def write_json(path: Path, document: Dict[str, Any]) -> None:
    """Write ``document`` as indented JSON, creating the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 100 or value == int(value):
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _margin(target: Dict[str, Any]) -> str:
    diff = abs(target["value"] - target["limit"])
    unit = f" {target['unit']}" if target["unit"] else ""
    times = f", {target['value'] / target['limit']:.1f}x the limit" if target["limit"] else ""
    return f"missed by {_fmt(diff)}{unit}{times}"


def summary_markdown(documents: List[Dict[str, Any]]) -> str:
    """The Markdown summary: one row per target, then skipped/failed benchmarks."""
    quick = any(d.get("quick") for d in documents)
    lines = [
        "# Benchmark summary",
        "",
        "Generated by `python -m benchmarks`" + (" (some with --quick: indicative only)" if quick else "") + ".",
        "Medians and p95 over repeated runs on a shared 2-core machine; see docs/benchmarks.md.",
        "",
        "| benchmark | target | figure | limit | met | detail |",
        "|---|---|---|---|---|---|",
    ]
    for doc in documents:
        for t in doc.get("targets", []):
            if t["met"] is None:
                verdict = "not measured"
            else:
                verdict = "yes" if t["met"] else f"**no** ({_margin(t)})"
            unit = f" {t['unit']}" if t["unit"] else ""
            label = doc["benchmark"] + (" (quick)" if doc.get("quick") else "")
            lines.append(
                f"| {label} | {t['name']} | {_fmt(t['value'])}{unit} | "
                f"{t['comparison']} {_fmt(t['limit'])}{unit} | {verdict} | {t.get('detail', '')} |"
            )
    extra = [d for d in documents if d.get("status") != "ok"]
    if extra:
        lines += ["", "Not run:", ""]
        lines += [f"- {d['benchmark']}: {d['status']} ({d.get('reason') or 'no reason given'})" for d in extra]
    highlights = [
        (d["benchmark"] + (" (quick)" if d.get("quick") else ""), n)
        for d in documents
        for n in d.get("metrics", {}).get("headline", [])
    ]
    if highlights:
        lines += ["", "Other figures:", ""]
        lines += [f"- {name}: {text}" for name, text in highlights]
    return "\n".join(lines) + "\n"
