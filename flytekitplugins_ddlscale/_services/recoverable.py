"""Which failures Flyte may retry: in a flytekit task pod the backend being unavailable for now
(``UNAVAILABLE_HERE``) is raised as :class:`RecoverableScalingError`, which FlytePropeller's ``retries``
apply to; anything else stays non-recoverable, and local runs keep the typed error.
"""
import contextlib
from typing import Iterator

from flytekit.exceptions.user import FlyteRecoverableException

from ..errors import NeverReachedError, ScalingError, TransientError

RETRYABLE = (TransientError, NeverReachedError)
"""The failures a task pod reports as recoverable (the connector's ``UNAVAILABLE_HERE``)."""


class RecoverableScalingError(FlyteRecoverableException):
    """A :data:`RETRYABLE` failure in a Flyte task pod, as flytekit marks a user error recoverable.

    ``error`` is the original typed error (also the ``__cause__``); the text is its text.
    """

    def __init__(self, error: ScalingError) -> None:
        super().__init__(str(error))
        self.error = error

    def __str__(self) -> str:
        name = type(self.error).__name__
        return f"{name}: {self.error} (recoverable: Flyte runs the task again if its retries allow)"


def _in_task_pod() -> bool:
    """Whether this is a Flyte task execution (``pyflyte-execute``), not a local run or plain Python."""
    from flytekit import FlyteContextManager

    state = FlyteContextManager.current_context().execution_state
    return state is not None and state.mode is not None and not state.is_local_execution()


@contextlib.contextmanager
def recoverable_in_pod() -> Iterator[None]:
    """Raise a :data:`RETRYABLE` error of the block as :class:`RecoverableScalingError` in a task pod;
    elsewhere, and for every other error, the error as it was."""
    try:
        yield
    except RETRYABLE as error:
        if not _in_task_pod():
            raise
        raise RecoverableScalingError(error) from error
