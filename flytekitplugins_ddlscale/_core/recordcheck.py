"""Values read back from stored records pass the checks of user input before anything acts on them.

A record (a local cluster's ``cluster.json``, a baseline or claim in a file
or an annotation) decides how many processes start and what is sent to a
service, so a hand-edited or damaged one must not: every reader checks each
field with :mod:`.validation`'s rules inside :func:`reading`, which turns
the :class:`InvalidInputError` into a :class:`CorruptRecordError` naming
the record.
"""
import contextlib
import json
from typing import Any, Collection, Dict, Iterator, Optional

from ..errors import CorruptRecordError, InvalidInputError


@contextlib.contextmanager
def reading(source: str, remedy: Optional[str] = None) -> Iterator[None]:
    """Checks inside the block that fail raise :class:`CorruptRecordError` naming ``source`` (and
    ``remedy``, what to do about it, when given), as does any failure to parse or convert what was read
    (a number too large, nesting too deep, a value of the wrong type): one line, never a traceback."""
    try:
        yield
    except CorruptRecordError:
        raise
    except InvalidInputError as exc:
        raise CorruptRecordError(source, exc.field, exc.value, exc.allowed, remedy) from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
        what = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise CorruptRecordError(source, "record", what, "a record as ddlscale writes it", remedy) from None


def json_object(text: str, field: str) -> Dict[str, Any]:
    """``text`` parsed as a JSON object; :class:`InvalidInputError` naming ``field`` otherwise."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        # RecursionError: nesting deeper than the interpreter's stack (a 2 KB file can hold it).
        data = None
    if not isinstance(data, dict):
        raise InvalidInputError(field, _excerpt(text), "a JSON object as ddlscale writes it")
    return data


def mapping(value: Any, field: str) -> Dict[str, Any]:
    """``value`` if it is a JSON object (a dict), else :class:`InvalidInputError` naming ``field``."""
    if not isinstance(value, dict):
        raise InvalidInputError(field, value, "a JSON object")
    return value


def only_fields(data: Dict[str, Any], known: Collection[str], required: Collection[str], where: str) -> None:
    """Refuse a field of ``data`` not in ``known``, or a ``required`` one that is missing."""
    allowed = f"the fields {', '.join(sorted(known))}"
    for key in data:
        if key not in known:
            raise InvalidInputError(f"{where}.{key}" if where else str(key), data[key], allowed)
    for key in required:
        if key not in data:
            raise InvalidInputError(f"{where}.{key}" if where else key, None, f"present ({allowed})")


def _excerpt(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
