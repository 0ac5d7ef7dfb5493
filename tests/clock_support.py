"""A clock a test sets by hand, for code that takes a ``clock`` callable (no tests here)."""


class Clock:
    """Returns ``now`` (seconds) until the test moves it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
