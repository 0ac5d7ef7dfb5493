"""Waiting on a cluster's pods by watching them, not polling.

A wait subscribes to the process's shared pod informer of its namespace (:mod:`._informer`) and is
woken when one of its pods, or its cluster object, changes. It ends when the condition holds, at its
timeout (:class:`ScalingTimeoutError` saying how long the API server was unreachable), early with
:class:`WorkerFailedError` for a pod failing to start longer than the grace period, or at once with
an error the informer met (403, 404).
"""
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ...errors import BackendUnavailableError, ScalingTimeoutError, TransientError, WorkerFailedError
from ...models import ClusterState
from ..._core.outage import outage_timeout
from ..._core.progress import ProgressReporter, WaitProgress
from ..._core.waiting import Deadline
from ._api import KubeApi
from ._informer import WAIT_LINGER, Subscription, subscribe
from ._spec import pod_failure

MAX_WINDOW = 30
"""Longest time (seconds) a wait goes without re-reading the cluster object."""
MIN_WINDOW = 0.05

Pods = Dict[str, Dict[str, Any]]
Check = Callable[[Pods, bool, Deadline], Tuple[bool, ClusterState, int]]
"""``check(pods, fresh, deadline)`` -> (done, state, progress count); ``fresh`` asks to re-read the
cluster object, within ``deadline``."""


@dataclass(eq=False)
class PodWaiter:
    """One wait on the pods matching ``selector`` in ``namespace``: for ``what`` (as errors and
    progress name it), until a check counts ``target``, at most ``timeout`` seconds."""

    api: KubeApi
    namespace: str
    selector: str
    what: str
    target: int
    timeout: float
    grace: float
    """Seconds a watched pod may fail to start before the wait ends early."""
    watched: Callable[[Dict[str, Any]], bool]
    """Which pods' failures end the wait early."""
    progress: Optional[ProgressReporter] = None
    cluster: Optional[str] = None
    """The cluster's label, for a timeout before its state could be read."""
    last: Optional[ClusterState] = None
    """The latest state seen; starts as the caller's read before the wait, so a wait whose own
    reads all fail still reports what was last known."""
    explain: Optional[Callable[[Pods, ClusterState], str]] = None
    """What a timeout adds about the pods it saw (e.g. workers of a scale-down still running), or ''."""
    changed: Optional[threading.Event] = None
    """Set by the pod subscription, and by whatever else should wake the wait (its cluster object's events)."""
    pods: Pods = field(default_factory=dict, init=False)
    _failing: Dict[Tuple[str, str], float] = field(default_factory=dict, init=False)
    _last_report: Optional[Tuple[int, str]] = field(default=None, init=False)

    def run(self, check: Check) -> ClusterState:
        """The final state once ``check`` says done; :class:`ScalingTimeoutError` (with the last state seen)
        at the timeout, an API server that did not answer before it included."""
        deadline = Deadline(self.timeout)
        sub = subscribe(self.api, self.namespace, self.selector, self.changed)
        try:
            return self._run(sub, check, deadline)
        except TransientError as exc:
            if not deadline.expired:
                raise
            raise outage_timeout(
                exc, deadline=deadline, what=self.what, tracker=self.api.outage, state=self.last,
                cluster=self.cluster,
            ) from None
        finally:
            sub.close(WAIT_LINGER)

    def _run(self, sub: Subscription, check: Check, deadline: Deadline) -> ClusterState:
        if not sub.wait_synced(deadline.remaining):
            # The informer is still riding out an outage (or a slow first list): the wait's time is up.
            raise sub.informer.last_error or BackendUnavailableError(
                f"the pods of namespace {self.namespace!r} were not listed in time"
            )
        self._raise_for(sub)
        self.pods = sub.snapshot()
        state = self._evaluate(check, deadline, fresh=True)
        fresh_at = time.monotonic()
        while state is None:
            sub.wait(self._window(deadline, fresh_at))
            self._raise_for(sub)
            relisted = sub.relisted
            self.pods = sub.snapshot()
            fresh = relisted or deadline.expired or time.monotonic() - fresh_at >= MAX_WINDOW
            if fresh:
                fresh_at = time.monotonic()
            state = self._evaluate(check, deadline, fresh=fresh)
        return state

    @staticmethod
    def _raise_for(sub: Subscription) -> None:
        if sub.error is not None:
            raise sub.error

    def _window(self, deadline: Deadline, fresh_at: float) -> float:
        limit = min(deadline.remaining, fresh_at + MAX_WINDOW - time.monotonic())
        if self._failing:
            limit = min(limit, min(self._failing.values()) + self.grace - time.monotonic())
        return max(MIN_WINDOW, min(float(MAX_WINDOW), limit))

    def _evaluate(self, check: Check, deadline: Deadline, fresh: bool) -> Optional[ClusterState]:
        done, state, count = check(self.pods, fresh, deadline)
        self.last = state
        if not done and not fresh and count >= self.target:
            # The pods look done only if the object agrees; re-read it to be sure.
            done, state, count = check(self.pods, True, deadline)
            self.last = state
        self._report(state, count, deadline)
        if done:
            return state
        self._check_failures(state)
        if deadline.expired:
            outage = self.api.outage.summary(deadline)
            raise ScalingTimeoutError(
                f"timed out after {self.timeout:.0f}s waiting for {self.what}; {outage + '; ' if outage else ''}"
                f"last state: {state.describe()}{self._failing_summary()}"
                f"{self.explain(self.pods, state) if self.explain is not None else ''}",
                cluster=state.cluster,
                state=state,
            )
        return None

    def _failures(self) -> Iterator[Tuple[str, Dict[str, Any], str, str]]:
        """The watched pods failing to start, by name: (name, pod, reason, message)."""
        for name, pod in sorted(self.pods.items()):
            failure = pod_failure(pod) if self.watched(pod) else None
            if failure is not None:
                yield name, pod, failure[0], failure[1]

    def _failing_summary(self) -> str:
        failing = [f"{name} {reason}" + (f" ({message})" if message else "") for name, _, reason, message
                   in self._failures()]
        return f"; pods not starting: {', '.join(failing)}" if failing else ""

    def _check_failures(self, state: ClusterState) -> None:
        now = time.monotonic()
        seen: Dict[Tuple[str, str], float] = {}
        failed: List[Tuple[float, str, str, str]] = []
        for name, pod, reason, message in self._failures():
            key = (pod["metadata"].get("uid", name), reason)
            since = seen[key] = self._failing.get(key, now)
            if now - since >= self.grace:
                failed.append((since, name, reason, message))
        self._failing = seen
        if failed:
            _, pod, reason, message = min(failed)
            raise WorkerFailedError(
                f"pod {pod} is {reason} for more than {self.grace:.0f}s while waiting for {self.what}: "
                f"{message}; last state: {state.describe()}",
                pod=pod,
                reason=reason,
                cluster=state.cluster,
                state=state,
            )

    def _report(self, state: ClusterState, count: int, deadline: Deadline) -> None:
        if self.progress is None:
            return
        key = (count, state.describe())
        if key == self._last_report:
            return
        self._last_report = key
        self.progress(WaitProgress(self.what, count, self.target, deadline.elapsed, self.timeout, state.describe()))
