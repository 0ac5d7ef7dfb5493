"""Environment variables set for a block and put back afterwards (the connection variables a run sees)."""
import contextlib
import os
from typing import Dict, Iterator, Mapping


@contextlib.contextmanager
def environ_set(values: Mapping[str, str]) -> Iterator[Dict[str, str]]:
    """Set ``values`` in ``os.environ`` for the block; restore what was there before on exit."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield dict(values)
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
