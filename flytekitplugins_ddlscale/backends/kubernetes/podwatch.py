"""Waiting on a cluster's pods by watching them, not polling.

List, then watch from the list's resourceVersion; apply events to a local
copy; survive dropped streams (resume from the last seen version) and 410
Gone (re-list), and ride out an API server outage (reads retried with
jittered backoff, see :mod:`flytekitplugins_ddlscale.outage`). A wait ends
when the condition holds, at its timeout with :class:`ScalingTimeoutError`
saying how long the API server was unreachable (every read and watch is
bounded by the time the wait has left), or early with
:class:`WorkerFailedError` when a pod has been Unschedulable, crash-looping or
failing to pull its image for longer than the grace period.
"""
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...errors import BackendUnavailableError, ScalingTimeoutError, WorkerFailedError
from ...models import ClusterState
from ...outage import OUTAGE_BACKOFF, outage_timeout
from ...progress import ProgressReporter, WaitProgress
from ...waiting import Deadline
from .api import KubeApi, WatchExpired
from .spec import pod_failure

MAX_WINDOW = 30
"""Longest single watch request (seconds): the cluster object is re-read between windows."""
MIN_WINDOW = 0.05

Pods = Dict[str, Dict[str, Any]]
Check = Callable[[Pods, bool, Deadline], Tuple[bool, ClusterState, int]]
"""``check(pods, fresh, deadline)`` -> (done, state, progress count); ``fresh`` asks to re-read the
cluster object, within ``deadline``."""


class PodWaiter:
    """One wait on the pods matching ``selector`` in ``namespace``."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        selector: str,
        *,
        what: str,
        target: int,
        timeout: float,
        grace: float,
        watched: Callable[[Dict[str, Any]], bool],
        progress: Optional[ProgressReporter] = None,
        cluster: Optional[str] = None,
    ) -> None:
        self.api = api
        self.cluster = cluster
        """The cluster's label, for a timeout before its state could be read."""
        self.namespace = namespace
        self.selector = selector
        self.what = what
        self.target = target
        self.timeout = timeout
        self.grace = grace
        self.watched = watched
        """Which pods' failures end the wait early."""
        self.progress = progress
        self.pods: Pods = {}
        self.version = ""
        self._failing: Dict[Tuple[str, str], float] = {}
        self._last_report: Optional[Tuple[int, str]] = None
        self._last_state: Optional[ClusterState] = None

    def run(self, check: Check) -> ClusterState:
        """Wait until ``check`` says done; return the final state.

        Raises :class:`ScalingTimeoutError` (with the last state seen, if any)
        at the timeout, including when a read fails because the API server
        did not answer before it.
        """
        deadline = Deadline(self.timeout)
        try:
            return self._run(check, deadline)
        except BackendUnavailableError as exc:
            if not deadline.expired:
                raise
            raise outage_timeout(
                exc, deadline=deadline, what=self.what, tracker=self.api.outage, state=self._last_state,
                cluster=self.cluster,
            ) from None

    def _run(self, check: Check, deadline: Deadline) -> ClusterState:
        self._relist(deadline)
        state = self._evaluate(check, deadline, fresh=True)
        if state is not None:
            return state
        pauses = OUTAGE_BACKOFF.intervals()
        while True:
            window = self._window(deadline)
            window_end = time.monotonic() + window
            try:
                for event in self.api.watch_pods(self.namespace, self.selector, self.version, window):
                    if self._apply(event):
                        state = self._evaluate(check, deadline, fresh=False)
                        if state is not None:
                            return state
                        if self._failing and min(self._failing.values()) + self.grace < window_end:
                            break
                pauses = OUTAGE_BACKOFF.intervals()
            except WatchExpired:
                self._relist(deadline)
            except BackendUnavailableError:
                # A dropped stream resumes from the last version seen; the
                # deadline bounds how long this keeps trying.
                time.sleep(min(next(pauses), deadline.remaining))
            state = self._evaluate(check, deadline, fresh=True)
            if state is not None:
                return state

    def _relist(self, deadline: Deadline) -> None:
        items, version = self.api.list_pods(self.namespace, self.selector, deadline)
        self.pods = {p["metadata"]["name"]: p for p in items}
        self.version = version

    def _apply(self, event: Dict[str, Any]) -> bool:
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self.version = str(meta["resourceVersion"])
        kind = event.get("type")
        if kind == "BOOKMARK":
            return False
        if kind == "DELETED":
            self.pods.pop(meta.get("name"), None)
        else:
            self.pods[meta["name"]] = obj
        return True

    def _window(self, deadline: Deadline) -> float:
        limit = deadline.remaining
        if self._failing:
            limit = min(limit, min(self._failing.values()) + self.grace - time.monotonic())
        return max(MIN_WINDOW, min(float(MAX_WINDOW), limit))

    def _evaluate(self, check: Check, deadline: Deadline, fresh: bool) -> Optional[ClusterState]:
        done, state, count = check(self.pods, fresh, deadline)
        self._last_state = state
        if not done and not fresh and count >= self.target:
            # The pods look done only if the object agrees; re-read it to be sure.
            done, state, count = check(self.pods, True, deadline)
            self._last_state = state
        self._report(state, count, deadline)
        if done:
            return state
        self._check_failures(state)
        if deadline.expired:
            outage = self.api.outage.summary(deadline)
            raise ScalingTimeoutError(
                f"timed out after {self.timeout:.0f}s waiting for {self.what}; {outage + '; ' if outage else ''}"
                f"last state: {state.describe()}{self._failing_summary()}",
                cluster=state.cluster,
                state=state,
            )
        return None

    def _failing_summary(self) -> str:
        failing = []
        for name, pod in sorted(self.pods.items()):
            failure = pod_failure(pod) if self.watched(pod) else None
            if failure is not None:
                failing.append(f"{name} {failure[0]}" + (f" ({failure[1]})" if failure[1] else ""))
        return f"; pods not starting: {', '.join(failing)}" if failing else ""

    def _check_failures(self, state: ClusterState) -> None:
        now = time.monotonic()
        seen: Dict[Tuple[str, str], float] = {}
        failed: List[Tuple[float, str, str, str]] = []
        for name, pod in self.pods.items():
            if not self.watched(pod):
                continue
            failure = pod_failure(pod)
            if failure is None:
                continue
            key = (pod["metadata"].get("uid", name), failure[0])
            since = self._failing.get(key, now)
            seen[key] = since
            if now - since >= self.grace:
                failed.append((since, name, failure[0], failure[1]))
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
