"""A poll schedule proposed for the scaler backend, measured beside the shipped one (not shipped).

Polling lag is bounded by the poll interval when the change happens; the
request count by the number of polls. :class:`TwoStageSchedule` polls fast
while most changes on a warm cluster happen and slower than the reference
client afterwards, which keeps lag low for short waits and the request
count at or below the reference client's for long ones. It has the
``intervals()`` method of :class:`flytekitplugins_ddlscale.waiting.Backoff`,
so it can be passed as ``ScalerServiceBackend(poll_backoff=...)``.
"""
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class TwoStageSchedule:
    """``initial`` doubling up to ``fast``, held until ``fast_until`` seconds, then ``slow``."""

    initial: float = 0.25
    fast: float = 1.0
    fast_until: float = 10.0
    slow: float = 3.0

    def intervals(self) -> Iterator[float]:
        """An endless iterator of sleep intervals in seconds."""
        elapsed = 0.0
        delay = self.initial
        while True:
            step = delay if elapsed < self.fast_until else self.slow
            yield step
            elapsed += step
            delay = min(self.fast, delay * 2.0)


SCALE_PROPOSAL = TwoStageSchedule(slow=3.0)
"""Scale waits: the reference polls every 2 s, so 3 s after the fast stage keeps the 60 s count below it."""
RESTART_PROPOSAL = TwoStageSchedule(slow=10.0)
"""Restart waits: the reference polls every 3 s, leaving a smaller budget for the slow stage."""
