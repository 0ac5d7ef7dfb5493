"""Collecting every text a user could see, to search it for credentials."""
import traceback
from typing import Iterable, List, Optional


def exception_texts(exc: Optional[BaseException]) -> List[str]:
    """str, repr, args, notes, attributes and the full traceback text of ``exc`` and its chain."""
    texts: List[str] = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts += [str(exc), repr(exc), repr(exc.args), repr(vars(exc))]
        texts += [str(note) for note in getattr(exc, "__notes__", [])]
        texts.append("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        exc = exc.__cause__ or exc.__context__
    return texts


def leaks(secrets: Iterable[str], texts: Iterable[str]) -> List[str]:
    """The secrets that occur in any of ``texts`` (empty when nothing leaked)."""
    corpus = "\n".join(texts)
    return [secret for secret in secrets if secret and secret in corpus]
