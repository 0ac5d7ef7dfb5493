"""Small helpers for the words people read in logs, progress and CLI output."""
from typing import Optional


def plural(count: int, noun: str, many: Optional[str] = None) -> str:
    """``count`` and ``noun``, pluralised by adding "s" (or as ``many``): ``1 worker``, ``2 workers``,
    ``0 workers``; ``plural(2, "process", "processes")``."""
    return f"{count} {noun}" if count == 1 else f"{count} {many or noun + 's'}"


def seconds(value: float) -> str:
    """A duration as people read it in messages: ``900s``, ``4.9s``, ``0.5s`` (never ``0s`` for half a second)."""
    return f"{round(value, 1):g}s"
