"""The scaler-service backend: scale Ray/Spark/Dask clusters through Domino's ``ddl-cluster-scaler``.

The service shows no pod readiness (a wait counts worker pods that exist), writes
only ``spec.worker.replicas`` (the autoscaler may undo a scale-up), stores
nothing with the cluster (records live in local files), has no head-tier route,
restarts only Ray heads and does not serve MPI clusters.
"""
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple, Union

import httpx

from .._support.crds import LABEL_HW_TIER, layout_of
from .._support.domino_auth import DominoAuth
from ..._core import settings
from ...errors import (
    CapacityExceededError, NotScalableError, ScalingError, ScalingTimeoutError, TransientError,
    UnsupportedOperationError,
)
from .._support.filerecords import FileBookkeeping
from .._support.filestore import FileRecordStore
from .._support.inplace import Reach, state_dir_env
from ...models import Baseline, ClusterState, ReplicaSpec, RestartResult, ScaleResult
from ..._core.outage import outage_timeout
from ..._core.progress import ProgressReporter, WaitProgress
from ...refs import KINDS, ClusterRef
from ..tiers import DominoTierCatalog, TierCatalog
from ..._core.validation import validate_tier_name
from ..._core.waiting import Awaited, Deadline, Pacing, PollSchedule, poll, poll_until
from .._base import BackendCapabilities, Change, SharedReads, WorkersWait
from .._filebacked import FileRecordsBackend
from ._client import ScalerClient, ScalerOptions, displayable_url, resolve_base_url

logger = logging.getLogger("flytekitplugins_ddlscale.scaler")

READINESS_CAVEAT = "the scaler service shows pod existence, not readiness"
READY = "restarted_and_ready"
"""The restart status of a head that is back and Ready."""
NUCLEUS_SETTINGS = (settings.DOMINO_API_HOST, settings.DOMINO_API_PROXY)
"""Where Nucleus (``/v4/hardwareTier``) is found when ``nucleus_url`` is not given, first set wins."""
SHARED_POLL_AGE = 0.3
"""Seconds a cluster read (or list) of one wait may answer another wait (at most about three polls
per second per cluster, or per kind while a list answers them, however many wait)."""
LISTED_POLL_INTERVAL = 0.3
"""Poll interval of a wait whose polls a shared list answers: its reads cost no request of their own."""


class ScalerServiceBackend(FileRecordsBackend):
    """A :class:`ClusterBackend` on Domino's cluster scaler service, over HTTP (docs/backends.md).

    A wait ends once the worker pods EXIST, the cluster is Running and ``spec.worker.replicas``
    agrees. Records are kept on this machine (``state_dir``, or ``records``). ``base_url`` defaults to
    ``$CLUSTER_SCALER_BASE_URL``, then the in-cluster service; credentials come from ``auth``, else
    :class:`DominoAuth` (``token``/``api_key``, then the environment); ``options`` say how requests are
    sent and waits polled. The tier catalog (``tier_catalog``, else Nucleus at ``nucleus_url`` or
    :data:`NUCLEUS_SETTINGS`) refuses unknown tier names early and names a recorded tier id on a restore.
    """

    name = "scaler"
    capabilities = BackendCapabilities(
        frozenset(kind for kind, info in KINDS.items() if info.served_by_scaler), observes_readiness=False,
        holds_size=False, persistent_baseline=False, observes_restarts=True,
    )

    def __init__(
        self,
        base_url: Optional[str] = None,
        *,
        token: Optional[str] = None,
        api_key: Optional[str] = None,
        auth: Optional[httpx.Auth] = None,
        state_dir: Union[str, Path, None] = None,
        records: Optional[FileBookkeeping] = None,
        tier_catalog: Optional[TierCatalog] = None,
        nucleus_url: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        options: ScalerOptions = ScalerOptions(),
    ) -> None:
        if auth is None and (token or api_key):
            auth = DominoAuth(token=token, api_key=api_key, verify=options.verify)
        self._client = ScalerClient(base_url, auth=auth, env=env, options=options)
        if records is None:
            store = FileRecordStore(Path(state_dir) / "records") if state_dir is not None else FileRecordStore()
            records = FileBookkeeping(store)
        self.records = records
        if tier_catalog is None:
            url = nucleus_url or next((s.raw(env) for s in NUCLEUS_SETTINGS if s.is_set(env)), None)
            if url:
                auth = self._client.auth
                tier_catalog = DominoTierCatalog(url, auth=auth, timeout=options.timeout, verify=options.verify)
        self._tiers = tier_catalog
        self._poll = options.poll_backoff
        self._restart_poll = options.restart_polls
        self._sleep = options.sleep

    @property
    def base_url(self) -> str:
        """The service URL in use."""
        return self._client.base_url

    def close(self) -> None:
        """Close the pooled HTTP connections."""
        self._client.close()

    def _unserved(self, ref: ClusterRef) -> str:
        return (
            f"the scaler service does not serve {ref.kind} clusters "
            f"(it serves {', '.join(sorted(self.capabilities.kinds))}); use the kubernetes backend"
        )

    def _observe(self, ref: ClusterRef) -> ClusterState:
        return state_from_object(ref, self._client.get_cluster(ref))

    def _shared_state(self, ref: ClusterRef, reads: SharedReads) -> ClusterState:
        """The cluster from the shared, paced polls of every wait on it (:meth:`~._client.ScalerClient.poll_cluster`)."""
        return state_from_object(ref, self._client.poll_cluster(ref, reads.deadline(), reads.max_age, reads.not_before))

    def cached_state(self, ref: ClusterRef, reads: SharedReads) -> Optional[ClusterState]:
        """The cluster from a shared poll :meth:`_shared_state` would reuse, or None."""
        ref = self._served(ref)
        found = self._client.cached_cluster(ref, reads.max_age, reads.not_before)
        return state_from_object(ref, found) if found is not None else None

    def _observe_before_change(self, ref: ClusterRef, deadline: Deadline, what: str) -> ClusterState:
        """The cluster now, riding out an outage until ``deadline`` (then a timeout waiting for ``what``)."""
        try:
            return state_from_object(ref, self._client.get_cluster(ref, deadline))
        except ScalingError as error:
            raise _timed_out(error, deadline, f"{what} to be accepted", ref, self._client) from None

    def _final_state(self, ref: ClusterRef, deadline: Deadline, what: str) -> ClusterState:
        """The cluster at the end of an operation, riding out an outage for what is left of ``deadline``
        (at least :data:`~flytekitplugins_ddlscale._core.waiting.MIN_STATE_READ`); then a timeout waiting for ``what``."""
        left = Deadline(deadline.left_for_state_read())
        try:
            return state_from_object(ref, self._client.get_cluster(ref, left))
        except ScalingError as error:
            raise _timed_out(error, left, what, ref, self._client) from None

    def _observe_for_wait(self, ref: ClusterRef, replicas: int, deadline: Deadline) -> Optional[ClusterState]:
        try:
            return state_from_object(ref, self._client.poll_cluster(ref, deadline, SHARED_POLL_AGE))
        except TransientError as error:
            if deadline.expired:
                raise _timed_out(error, deadline, f"{replicas} worker pods of {ref}", ref, self._client) from None
            return None

    def _wait_workers(self, ref: ClusterRef, wait: WorkersWait) -> ClusterState:
        replicas = wait.replicas
        seen = [wait.last]
        what = f"{replicas} worker pods of {ref} with the cluster Running ({READINESS_CAVEAT})"
        deadline = Deadline(wait.timeout)

        def read() -> ClusterState:
            # A failed poll (cluster deleted, access revoked) reports the last state this wait saw.
            try:
                seen[0] = state_from_object(ref, self._client.poll_cluster(ref, deadline, SHARED_POLL_AGE))
            except ScalingError as error:
                error.state = error.state or seen[0]
                raise _timed_out(error, deadline, what, ref, self._client) from None
            return seen[0]

        awaited = Awaited(
            what, replicas, lambda s: s.existing_workers, lambda s: s.status == "Running" and s.workers_up(replicas)
        )
        pacing = Pacing(
            _ListedSchedule(self._poll, lambda: self._client.shared_by_list(ref)), self._sleep,
            self._client.outage.summary,
        )
        return poll_until(read, awaited, wait.timeout, wait.progress, pacing)

    def _check_tier(self, ref: ClusterRef, tier: Optional[str], field: str) -> Optional[str]:
        if tier is None or self._tiers is None:
            return tier
        try:
            resolved = self._tiers.resolve(tier, ref.kind, field=field)
        except TransientError as error:
            logger.warning("%s: could not check tier %r in the tier catalog (%s); the service will judge it", ref, tier, error)
            return tier
        return resolved.name if resolved is not None else tier

    def _same_tier(self, ref: ClusterRef, name: str, observed: Optional[str]) -> bool:
        """A claim's tier NAME against the tier id label the cluster showed (through the catalog)."""
        if name == observed:
            return True
        if self._tiers is None or observed is None:
            return False
        try:
            return any(t.id == observed and t.name == name for t in self._tiers.tiers())
        except TransientError:
            return False

    def _check_size(self, previous: ClusterState, replicas: int, strict: bool) -> None:
        if previous.autoscaling_max is None:
            raise NotScalableError(
                "the cluster has no usable spec.autoscaling.maxReplicas, and the scaler service "
                "only scales autoscaling clusters", cluster=previous.cluster, state=previous,
            )
        if strict and replicas > previous.autoscaling_max:
            raise CapacityExceededError(
                f"strict: {replicas} workers requested but maxReplicas is {previous.autoscaling_max}; "
                f"nothing was changed", cluster=previous.cluster, state=previous,
            )

    def _apply_size(
        self, ref: ClusterRef, replicas: int, tier: Optional[str], previous: ClusterState, deadline: Deadline
    ) -> Change:
        return Change(self._patch(ref, replicas, tier, previous, deadline))

    def _apply_baseline(
        self, ref: ClusterRef, baseline: Optional[Baseline], target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Change:
        previous = self._observe_before_change(ref, deadline, f"the restore of {ref}")
        if target is not None:
            replicas, tier = target.replicas, validate_tier_name(target.worker_hw_tier)
        else:
            assert baseline is not None
            replicas, tier = baseline.replicas, self._tier_to_restore(ref, baseline, previous)
        return Change(self._patch(ref, replicas, tier, previous, deadline), restoring=True)

    def _patch(
        self, ref: ClusterRef, replicas: int, tier: Optional[str], previous: ClusterState, deadline: Deadline
    ) -> ScaleResult:
        # A refused connection is tried again until the operation's deadline; other failures get
        # the client's bounded retries (an absolute count is safe to repeat).
        try:
            answer = self._client.scale(ref, replicas, tier, deadline)
        except ScalingError as error:
            error.state = error.state or previous
            raise _timed_out(
                error, deadline, f"the scale request to {replicas} workers of {ref} to be accepted", ref, self._client
            ) from None
        requested = int(answer.get("requested_replicas", replicas))
        effective = int(answer.get("effective_replicas", replicas))
        capped = bool(answer.get("capped", effective < requested))
        if capped:
            logger.warning("%s: %d workers requested, capped to maxReplicas=%s", ref, requested,
                           answer.get("maxReplicas"))
        obj = answer.get("object")
        final = state_from_object(ref, obj) if isinstance(obj, dict) else self._observe_before_change(
            ref, deadline, f"{ref} after the scale request"
        )
        return ScaleResult.sent(str(ref), previous, requested, effective, capped=capped, final=final,
                                worker_hw_tier=tier)

    def _restart_head(
        self, ref: ClusterRef, tier: Optional[str], wait: bool, deadline: Deadline,
        progress: Optional[ProgressReporter],
    ) -> RestartResult:
        if tier is not None:
            raise UnsupportedOperationError(
                "the scaler service cannot change the head's hardware tier (restart only deletes the "
                "pod); use the kubernetes backend for head_hw_tier", cluster=str(ref),
            )
        # Best effort, for the wait's error context only: the restart's own answer decides what happens.
        before = self._state_or_none(ref) if wait else None
        try:
            answer = self._client.restart_head(ref, deadline)
        except ScalingError as error:
            error.state = error.state or before
            raise _timed_out(error, deadline, f"the head restart of {ref} to be accepted", ref, self._client) from None
        pod = str(answer.get("pod") or layout_of(ref).head_pod_name(ref.name))
        started_at = str(answer.get("started_at") or "")
        began = time.monotonic()
        if wait:
            self._wait_restarted(ref, pod, started_at, deadline.left_for_wait(), progress, before)
        state = self._final_state(ref, deadline, f"the state of {ref} after its head restart")
        waited = time.monotonic() - began if wait else 0.0
        return RestartResult(str(ref), pod, started_at, wait, state, waited=wait, seconds_waited=waited)

    def _head_restarted(
        self, ref: ClusterRef, restart: RestartResult, reads: Optional[SharedReads]
    ) -> Tuple[bool, ClusterState]:
        """The service's restart status since the restart's ``started_at`` is ``restarted_and_ready``."""
        if reads is not None:
            # Every execution polling this restart shares one status read per max_age.
            deadline = reads.deadline()
            answer = self._client.polls.read(
                f"restart:{ref.plural}/{ref.name}@{restart.started_at}",
                lambda: self._client.restart_status(ref, restart.started_at, deadline), reads.max_age, deadline,
            )
        else:
            answer = self._client.restart_status(ref, restart.started_at)
        done = answer is not None and answer.get("status") == READY
        return done, self.get_state(ref, reads)

    def _wait_restarted(
        self, ref: ClusterRef, pod: str, started_at: str, timeout: float, progress: Optional[ProgressReporter],
        before: Optional[ClusterState],
    ) -> None:
        what = f"new head pod {pod} of {ref} restarted and Ready"
        deadline = Deadline(timeout)

        def read() -> str:
            try:
                answer = self._client.restart_status(ref, started_at, deadline)
            except ScalingError as error:
                # A failed status poll (service gone) still says what the cluster last looked like.
                error.state = error.state or before
                raise _timed_out(error, deadline, what, ref, self._client) from None
            last = str(answer.get("status")) if answer is not None else "head_pod_not_found (being recreated)"
            if progress is not None:
                progress(WaitProgress(what, int(last == READY), 1, deadline.elapsed, timeout, last))
            return last

        def timed_out(last: str) -> ScalingTimeoutError:
            outage = self._client.outage.summary(deadline)
            return ScalingTimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}; {outage + '; ' if outage else ''}"
                f"last restart status: {last}", cluster=str(ref), state=self._state_or_none(ref),
            )

        poll(read, lambda last: last == READY, deadline=deadline, schedule=self._restart_poll, timed_out=timed_out,
             sleep=self._sleep)

    def _state_or_none(self, ref: ClusterRef) -> Optional[ClusterState]:
        try:
            return self.get_state(ref)
        except ScalingError:
            return None

    def _reach(self, ref: ClusterRef) -> Reach:
        """How ``ddlscale`` and a new process reach this service and these records."""
        env: Dict[str, str] = {}
        options: Dict[str, str] = {}
        if self.base_url != displayable_url(resolve_base_url(None)):
            env[settings.CLUSTER_SCALER_BASE_URL.name] = options["base_url"] = self.base_url
        # A custom ``records=`` store elsewhere has no setting that names it: the hint then uses the default.
        state = state_dir_env(self.records.store.directory, "records")
        if state:
            env.update(state)
            options["state_dir"] = state[settings.STATE_DIR.name]
        return Reach(self.name, ref, env=env, options=options)

    def _tier_to_restore(self, ref: ClusterRef, baseline: Baseline, current: ClusterState) -> Optional[str]:
        wanted = baseline.worker_hw_tier
        if not wanted or wanted == current.worker_hw_tier:
            return None
        if self._tiers is not None:
            try:
                for tier in self._tiers.tiers():
                    if tier.id == wanted or tier.name == wanted:
                        return tier.name
            except TransientError as error:
                logger.warning("%s: tier catalog unavailable (%s)", ref, error)
        logger.warning(
            "%s: restoring %d workers but not the worker tier %r (no tier catalog maps that id to a name)",
            ref, baseline.replicas, wanted,
        )
        return None


@dataclass(frozen=True)
class _ListedSchedule:
    """``base``'s intervals, shortened to :data:`LISTED_POLL_INTERVAL` while ``listed()`` (a shared list
    answers the polls, so polling more often sends no more requests)."""

    base: PollSchedule
    listed: Callable[[], bool]

    def intervals(self) -> Iterator[float]:
        """An endless iterator of sleep intervals in seconds."""
        for step in self.base.intervals():
            yield min(step, LISTED_POLL_INTERVAL) if self.listed() else step


def _timed_out(
    error: ScalingError, deadline: Deadline, what: str, ref: ClusterRef, client: ScalerClient
) -> ScalingError:
    """``error`` of a request; once the operation's deadline has passed, a :class:`ScalingTimeoutError`
    saying how long the service was unreachable, with the same last state."""
    if not isinstance(error, TransientError) or not deadline.expired:
        return error
    return outage_timeout(error, deadline=deadline, what=what, tracker=client.outage, state=error.state,
                          cluster=str(ref))


def _int_or_none(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def state_from_object(ref: ClusterRef, obj: Dict[str, Any]) -> ClusterState:
    """The state of ``ref`` in its custom object ``obj``, as the service returns it: the service shows
    no pod readiness, so ``existing_workers`` counts the worker pod names in ``status.nodes``,
    ``ready_workers`` is None and ``head_ready`` is True only while the cluster is Running."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    worker = spec.get("worker") or {}
    head = spec.get(layout_of(ref).head_section or "", {}) or {}
    autoscaling = spec.get("autoscaling")
    prefix = layout_of(ref).worker_pod_prefix(ref.name)
    nodes = status.get("nodes") or []
    cluster_status = status.get("clusterStatus") or "Unknown"
    return ClusterState(
        cluster=str(ref),
        status=cluster_status,
        desired_workers=_int_or_none(worker.get("replicas")) or 0,
        existing_workers=sum(1 for node in nodes if isinstance(node, str) and node.startswith(prefix)),
        ready_workers=None,
        head_ready=True if cluster_status == "Running" and layout_of(ref).head_section else None,
        worker_hw_tier=(worker.get("labels") or {}).get(LABEL_HW_TIER),
        head_hw_tier=(head.get("labels") or {}).get(LABEL_HW_TIER),
        autoscaling_min=_int_or_none(autoscaling.get("minReplicas")) if isinstance(autoscaling, dict) else None,
        autoscaling_max=_int_or_none(autoscaling.get("maxReplicas")) if isinstance(autoscaling, dict) else None,
    )
