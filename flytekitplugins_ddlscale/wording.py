"""Small helpers for the words people read in logs, progress and CLI output."""


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, pluralised by adding "s": ``1 worker``, ``2 workers``, ``0 workers``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
