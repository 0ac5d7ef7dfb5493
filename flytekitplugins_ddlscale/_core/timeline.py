"""Worker counts over time while a node or phase runs: a wait's progress reports go into a
:class:`WorkerTimeline` through :func:`recording`, and :mod:`.deck` draws it."""
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ..models import ClusterState
from .progress import ProgressReporter, WaitProgress

UNLABELLED_TIER = "(default tier)"
"""Key of worker-seconds for workers whose tier is not labelled."""


@dataclass(frozen=True)
class Sample:
    """The worker count seen at ``seconds`` after the timeline started."""

    seconds: float
    workers: int
    tier: Optional[str] = None


class WorkerTimeline:
    """A thread-safe series of worker-count samples, starting at creation."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self._lock = threading.Lock()
        self._samples: List[Sample] = []
        self._marks: List[Tuple[float, str]] = []
        self._end: Optional[float] = None

    def add(self, workers: int, tier: Optional[str] = None, seconds: Optional[float] = None) -> None:
        """Record ``workers`` (on ``tier``) now, or at ``seconds`` after the start."""
        at = self._clock() - self._start if seconds is None else seconds
        with self._lock:
            self._samples.append(Sample(max(0.0, at), max(0, int(workers)), tier))

    def mark(self, label: str) -> None:
        """Label this moment (e.g. ``restore``); the plot draws it as a dashed line."""
        with self._lock:
            self._marks.append((max(0.0, self._clock() - self._start), label))

    @property
    def marks(self) -> List[Tuple[float, str]]:
        """The labelled moments, as (seconds, label), in time order."""
        with self._lock:
            return sorted(self._marks)

    def finish(self) -> None:
        """Mark the end of the timeline: worker-seconds are integrated up to here."""
        with self._lock:
            self._end = self._clock() - self._start

    @property
    def samples(self) -> List[Sample]:
        """The samples in time order."""
        with self._lock:
            return sorted(self._samples, key=lambda s: s.seconds)

    @property
    def duration(self) -> float:
        """Seconds from the start to :meth:`finish` (or to the last sample, or now)."""
        with self._lock:
            if self._end is not None:
                return self._end
        return self._clock() - self._start

    def worker_seconds_by_tier(self) -> Dict[str, float]:
        """Worker-seconds per tier, each sample's count held until the next sample; a sample without a tier
        (a wait's progress) counts on the tier of the next sample that has one: the tier the change went to."""
        samples = self.samples
        end = max(self.duration, samples[-1].seconds if samples else 0.0)
        totals: Dict[str, float] = {}
        tiers = _tiers_filled_forward(samples)
        for current, following, tier in zip(samples, samples[1:] + [None], tiers):
            until = following.seconds if following is not None else end
            totals[tier] = totals.get(tier, 0.0) + current.workers * max(0.0, until - current.seconds)
        return totals

    def tiers_used(self) -> List[str]:
        """The tiers that had at least one worker up at some sample (tier as in
        :meth:`worker_seconds_by_tier`), sorted."""
        samples = self.samples
        return sorted({tier for sample, tier in zip(samples, _tiers_filled_forward(samples)) if sample.workers > 0})

    def last_tier(self) -> Optional[str]:
        """The tier of the latest sample that has one (None: no sample names a tier)."""
        return next((sample.tier for sample in reversed(self.samples) if sample.tier), None)


def _tiers_filled_forward(samples: List[Sample]) -> List[str]:
    """Each sample's tier; one without takes the next named tier, else :data:`UNLABELLED_TIER`."""
    tiers: List[str] = []
    following = UNLABELLED_TIER
    for sample in reversed(samples):
        following = sample.tier or following
        tiers.append(following)
    return tiers[::-1]


def observed_workers(state: ClusterState) -> int:
    """Ready workers where the backend sees readiness, else existing workers."""
    return state.ready_workers if state.ready_workers is not None else state.existing_workers


def recording(timeline: WorkerTimeline, tier: Optional[str], then: Optional[ProgressReporter]) -> ProgressReporter:
    """A reporter that samples worker counts into ``timeline`` and forwards to ``then``."""

    def report(progress: WaitProgress) -> None:
        timeline.add(progress.current, tier)
        if then is not None:
            then(progress)

    return report
