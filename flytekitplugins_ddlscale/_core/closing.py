"""Objects a ``with`` block closes: ``with get_backend() as backend:``, ``with reporter:``."""
from typing import TypeVar

C = TypeVar("C", bound="Closing")


class Closing:
    """``with`` gives the object itself and calls its ``close()`` when the block ends, however it ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: C) -> C:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
