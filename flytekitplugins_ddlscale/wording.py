"""Small helpers for the words people read in logs, progress and CLI output."""


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, pluralised by adding "s": ``1 worker``, ``2 workers``, ``0 workers``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def seconds(value: float) -> str:
    """A duration as people read it in messages: ``900s``, ``4.9s``, ``0.5s`` (never ``0s`` for half a second)."""
    return f"{round(value, 1):g}s"
