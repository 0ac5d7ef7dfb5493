"""The scaler backend's previous poll schedule, measured beside the shipped one.

The backend now ships :class:`flytekitplugins_ddlscale._core.waiting.TwoStageBackoff`
(fast for the first 10 s, then slower than the reference client). Keeping
the schedule it replaced in the same run shows what the change bought.
"""
from flytekitplugins_ddlscale._core.waiting import Backoff

PREVIOUS_SCHEDULE = Backoff(initial=0.25, factor=1.5, cap=2.0)
"""0.25 s growing 1.5x to a 2 s cap, for scale and restart waits alike."""
