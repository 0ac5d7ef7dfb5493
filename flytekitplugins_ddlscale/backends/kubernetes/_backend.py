"""The Kubernetes backend: cluster custom resources patched directly (Domino's DCO kinds, KubeRay's
RayCluster, the Dask operator's worker groups; what differs per operator is in ``_resources/``).

Each change is ONE merge patch carrying the object's resourceVersion (a 409 re-reads), the baseline
and claims recorded in annotations in the same patch, so any process can restore. Waits watch pods;
state reads may come from the shared cache (:mod:`._informer`), never older than this process's last
write or read; every read a change is built from goes to the server. An outage is ridden out until
the operation's timeout.
"""
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from ..._core import settings
from ...errors import (
    ClusterNotFoundError,
    ConflictError,
    InvalidInputError,
    ScalingError,
    TransientError,
    UnauthorizedError,
    UnsupportedOperationError,
)
from ..._framework.probes import idle_worker_ips
from .._support.inplace import Reach
from ..._core import claimrules
from ..._core.claimrules import ClusterRecords, RecordChange, Size
from ..._core.leases import log_dropped
from ...models import Baseline, ClusterState, ReplicaSpec, RestartResult, ScaleResult, utcnow
from ..._core.outage import ONCE, RetryRule, outage_timeout, send
from ..._core.progress import ProgressReporter
from ..._core.records import (
    BASELINE_ANNOTATION,
    CLAIMS_ANNOTATION,
    OUTSIDE_ANNOTATION,
    Claim,
    decode_claims,
    encode_claims,
)
from ...refs import DEFAULT_NAMESPACE, ClusterRef, validate_name
from .._support.crds import LABEL_HW_TIER, LABEL_OWNER, LAYOUTS, layout_of
from ..tiers import DominoTierCatalog, FileTierCatalog, HardwareTier, TierCatalog
from ..._core.validation import validate_tier_name, validate_timeout
from ..._core.waiting import Deadline
from .._base import BackendCapabilities, Change, ClusterBackend, SharedReads, WorkersWait
from ._api import PODS, READS, Conflict, KubeApi, Resource, make_api_client
from ._informer import (
    WAIT_LINGER, VersionsSeen, cache_lacks, cached_object, cached_pods, expect_version, hold, matches, note_version,
    parse_selector,
)
from ._podwatch import Check, PodWaiter
from ._resources.base import NotCreatedYet, Outcome, ResourceAdapter, Restoring, Sizing, mark_idle
from ._resources.daskop import DaskOperatorAdapter
from ._resources.dco import DcoAdapter
from ._resources.kuberay import KubeRayAdapter
from ._spec import decode_record, encode_record, pod_labels, pod_ready, pod_terminating

_ADAPTERS: Dict[str, ResourceAdapter] = {}
"""One adapter per kind (adapters keep no state): :class:`DcoAdapter` for Domino's operator,
:class:`KubeRayAdapter` for RayCluster, :class:`DaskOperatorAdapter` for DaskWorkerGroups."""
_FLAVOURS = {"dco": DcoAdapter, "kuberay": KubeRayAdapter, "daskop": DaskOperatorAdapter}
RAY_DASHBOARD = "http://{name}-head-svc.{namespace}.svc:8265"
"""Where a KubeRay cluster's Ray dashboard answers: KubeRay's head service, the dashboard port."""
IDLE_READ_TIMEOUT = 2.0
"""Seconds each read of the Ray head's idle workers may take before the scale-down goes on without them."""
Patch = Dict[str, Any]
logger = logging.getLogger("flytekitplugins_ddlscale.kubernetes")


@dataclass(frozen=True)
class _Patched:
    """What the wait after a patch needs: the tier id its workers carry, the object it left, and the
    operation's deadline (which also bounds the state read reported without a wait)."""

    tier_id: Optional[str]
    after: Dict[str, Any]
    deadline: Deadline


def _new_head(pod: Dict[str, Any], replaced_uid: str, tier_id: Optional[str]) -> bool:
    """Whether ``pod`` is a Ready head other than the one replaced, on ``tier_id`` when one was asked for."""
    metadata = pod["metadata"]
    return (
        metadata.get("uid") != replaced_uid and pod_ready(pod)
        and (tier_id is None or (metadata.get("labels") or {}).get(LABEL_HW_TIER) == tier_id)
    )


def _annotations(obj: Dict[str, Any]) -> Dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _claims_on(obj: Dict[str, Any]) -> Dict[str, Claim]:
    """Every claim in ``obj``'s claims annotation, live or dead."""
    return decode_claims(_annotations(obj).get(CLAIMS_ANNOTATION))


def _records_on(obj: Dict[str, Any]) -> ClusterRecords:
    """The claims, baseline and size outside phases recorded in ``obj``'s annotations."""
    record, outside = decode_record(obj), decode_record(obj, OUTSIDE_ANNOTATION)
    return ClusterRecords(_claims_on(obj), record[0] if record else None, outside[0] if outside else None)


class KubernetesBackend(ClusterBackend):
    """Scales clusters by patching their custom resources with the official client: Domino's DCO kinds,
    KubeRay's RayCluster (``kuberay``) and the Dask operator's worker groups (``dask-operator``).

    ``namespace`` is used for refs without one. The API client comes from ``api_client``, else
    in-cluster config (``in_cluster=True``, or None inside a pod without ``kubeconfig``), else
    ``kubeconfig``/``context``. Tiers resolve through ``tier_catalog``, else ``tiers_file``, else
    Domino's API through ``$DOMINO_API_PROXY``, else ``$DDLSCALE_TIERS_FILE``. Clusters whose
    ``dominodatalab.com/starting-user-id`` label is not ``owner`` (``$DOMINO_STARTING_USER_ID``) are
    refused unless ``allow_foreign``. A pod failing to start for ``failure_grace`` seconds ends a wait.
    A KubeRay scale-down removes the workers the Ray head reports idle first, asking its dashboard at
    ``ray_dashboard`` (``{name}``/``{namespace}`` filled in; None: never asked).
    """

    name = "kubernetes"
    capabilities = BackendCapabilities(  # every kind laid out on Kubernetes
        frozenset(LAYOUTS), head_tier=True, observes_restarts=True
    )

    def __init__(
        self,
        namespace: str = DEFAULT_NAMESPACE,
        kubeconfig: Optional[str] = None,
        context: Optional[str] = None,
        in_cluster: Optional[bool] = None,
        tier_catalog: Optional[TierCatalog] = None,
        api_client: Any = None,
        *,
        tiers_file: Optional[str] = None,
        owner: Optional[str] = None,
        allow_foreign: bool = False,
        failure_grace: float = 30.0,
        request_timeout: float = 30.0,
        conflict_retries: int = 8,
        ray_dashboard: Optional[str] = RAY_DASHBOARD,
    ) -> None:
        self.namespace = validate_name(namespace, field="namespace")
        self.failure_grace = validate_timeout(failure_grace, field="failure_grace")
        self.request_timeout = validate_timeout(request_timeout, field="request_timeout")
        if isinstance(conflict_retries, bool) or not isinstance(conflict_retries, int) or conflict_retries < 1:
            raise InvalidInputError("conflict_retries", conflict_retries, "an integer >= 1")
        self.conflict_retries = conflict_retries
        if ray_dashboard is not None and not isinstance(ray_dashboard, str):
            raise InvalidInputError("ray_dashboard", ray_dashboard, f"a URL such as {RAY_DASHBOARD}, or None")
        self.ray_dashboard = ray_dashboard
        self.owner = settings.DOMINO_STARTING_USER_ID.value(owner)
        self.allow_foreign = allow_foreign
        self._kubeconfig, self._context, self._in_cluster = kubeconfig, context, in_cluster
        self._given_client = api_client
        self._tier_catalog = tier_catalog
        self._tiers_file = tiers_file
        self._api: Optional[KubeApi] = None
        self._lock = threading.Lock()
        self._versions = VersionsSeen()

    # -- plumbing ----------------------------------------------------------
    @property
    def api(self) -> KubeApi:
        """The API wrapper, created on first use."""
        with self._lock:
            if self._api is None:
                client = self._given_client or make_api_client(self._kubeconfig, self._context, self._in_cluster)
                self._api = KubeApi(client, self.request_timeout)
            return self._api

    def _ns(self, ref: ClusterRef) -> str:
        return ref.namespace or self.namespace

    def _full(self, ref: ClusterRef) -> ClusterRef:
        """``ref`` naming its namespace, as adapters take it."""
        return ClusterRef(ref.kind, ref.name, self._ns(ref), ref.group)

    def _label(self, ref: ClusterRef) -> str:
        return str(self._full(ref))

    @staticmethod
    def _adapter(ref: ClusterRef) -> ResourceAdapter:
        layout = layout_of(ref)
        if layout.kind not in _ADAPTERS:
            _ADAPTERS[layout.kind] = _FLAVOURS[layout.flavour](layout)
        return _ADAPTERS[layout.kind]

    def _selector(self, ref: ClusterRef, role: Optional[str] = None) -> str:
        return self._adapter(ref).pod_selector(ref, role)

    def _read(self, ref: ClusterRef, deadline: Optional[Deadline] = None, rule: RetryRule = READS) -> Dict[str, Any]:
        adapter = self._adapter(ref)
        try:
            obj = self.api.read_object(self._resource(ref), self._ns(ref), adapter.object_name(ref), deadline, rule)
        except ClusterNotFoundError:
            adapter.explain_missing(ref, self._ns(ref), self.api, deadline)
            raise
        self._noted(ref, adapter.plural, adapter.object_name(ref), obj)
        return obj

    def _noted(self, ref: ClusterRef, plural: str, name: str, obj: Dict[str, Any]) -> None:
        """This process wrote ``obj`` (a patch's answer) or read it from the server: the shared cache must
        not answer for it from before, and :meth:`version_seen` gives its version to another process."""
        version = note_version(self.api, self._ns(ref), self._resource(ref, plural), name, obj)
        self._versions.saw((self._ns(ref), plural, name), version)

    def version_seen(self, ref: ClusterRef) -> str:
        """The resourceVersion of ``ref``'s object holding its size as this process last wrote or read it
        ('' where it has not, or no longer remembers)."""
        adapter = self._adapter(self._served(ref))
        return self._versions.newest((self._ns(ref), adapter.plural, adapter.object_name(ref)))

    def expect_version(self, ref: ClusterRef, version: str) -> None:
        """The shared cache answers for ``ref``'s object holding its size only from resourceVersion
        ``version`` on (another process wrote or read it there); reads before go to the API server."""
        adapter = self._adapter(self._served(ref))
        expect_version(self.api, self._ns(ref), self._resource(ref), adapter.object_name(ref), version)

    def _resource(self, ref: ClusterRef, plural: Optional[str] = None) -> Resource:
        adapter = self._adapter(ref)
        return Resource(plural or adapter.plural, adapter.group, adapter.version)

    def _observed(
        self, ref: ClusterRef, deadline: Optional[Deadline] = None, linger: Optional[float] = None
    ) -> Dict[str, Any]:
        """The cluster object for a state report (never for building a patch): given a ``linger`` (a
        service's shared reads, a wait's checks), the shared cache's copy where it can answer (its informer
        started and kept ``linger`` seconds, :func:`~._informer.cached_object`), else the server's. Other
        reads (a command's, a create's: what they decide on) go to the server, and so set the version the
        cache must reach before it answers."""
        if linger is not None:
            name = self._adapter(ref).object_name(ref)
            cached = cached_object(self.api, self._ns(ref), self._resource(ref), name, linger)
            if cached is not None:
                return cached
        return self._read(ref, deadline)

    def _pods(
        self, ref: ClusterRef, role: Optional[str] = None, deadline: Optional[Deadline] = None, linger: float = 0.0
    ) -> List[Dict[str, Any]]:
        """The cluster's pods: from the shared informer's cache when one is synced for the namespace (or,
        given a ``linger``, started for the read and kept that long after it), else one list."""
        wait = deadline.remaining if deadline is not None else self.request_timeout
        cached = cached_pods(self.api, self._ns(ref), self._selector(ref, role), linger, wait)
        if cached is not None:
            return cached
        return self.api.list_objects(PODS, self._ns(ref), self._selector(ref, role), deadline)[0]

    def _marked_idle(self, ref: ClusterRef, pods: List[Dict[str, Any]], deadline: Deadline) -> List[Dict[str, Any]]:
        """``pods`` with the workers the cluster's Ray head reports idle marked (:func:`~.resources.base.mark_idle`),
        for kinds whose head is asked; unmarked when it is not asked, has no worker to report on, or does not tell."""
        if not self._adapter(ref).idle_from_ray_head or self.ray_dashboard is None or not self._workers(ref, pods):
            return pods
        url = self.ray_dashboard.format(name=ref.name, namespace=self._ns(ref))
        idle = idle_worker_ips(url, max(0.2, min(IDLE_READ_TIMEOUT, deadline.remaining)))
        return pods if idle is None else mark_idle(pods, idle)

    def _workers(self, ref: ClusterRef, pods: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        adapter = self._adapter(ref)
        return [p for p in pods if adapter.is_worker(p)]

    @contextlib.contextmanager
    def _until(self, ref: ClusterRef, deadline: Deadline, what: str, state: Optional[ClusterState]) -> Iterator[None]:
        """Turn an API server that stayed unreachable until ``deadline`` into a timeout waiting for
        ``what``, with ``state`` if one was read."""
        try:
            yield
        except TransientError as error:
            if not deadline.expired:
                raise
            raise outage_timeout(
                error, deadline=deadline, what=what, tracker=self.api.outage, state=state, cluster=self._label(ref),
            ) from None

    def _opening(
        self, ref: ClusterRef, deadline: Deadline, what: str, role: Optional[str] = None, idle: bool = False
    ) -> Tuple[Dict[str, Any], List[Dict[str, Any]], ClusterState]:
        """What a change starts from, read from the server (riding out an outage, see :meth:`_until`): the
        cluster object (refused when another user's, :meth:`_check_owner`), its ``role`` pods (with the idle
        workers marked when ``idle``, :meth:`_marked_idle`) and the state they show."""
        with self._until(ref, deadline, what, None):
            obj = self._read(ref, deadline)
            self._check_owner(ref, obj)
            pods = self._pods(ref, role, deadline)
            state = self._state(ref, obj, pods)
        return obj, self._marked_idle(ref, pods, deadline) if idle else pods, state

    def _resolve(self, name: Optional[str], kind: str, field: str) -> Optional[HardwareTier]:
        wanted = validate_tier_name(name, field=field)
        if wanted is None:
            return None
        if self._tier_catalog is None:
            self._tier_catalog = _tier_catalog_from_env(self._tiers_file, field, wanted)
        return self._tier_catalog.resolve(wanted, kind, field=field)

    def check_owner(self, ref: ClusterRef, owner: str) -> None:
        """Refuse ``ref`` (:class:`UnauthorizedError`, nothing changed) unless it is labelled as ``owner``'s, as a
        connector's per-project rule asks: an unlabelled cluster is no one's. One read of the cluster object."""
        found = ((self._read(ref).get("metadata") or {}).get("labels") or {}).get(LABEL_OWNER)
        if found != owner:
            raise UnauthorizedError(
                f"cluster is labelled {LABEL_OWNER}={found!r}, not {owner!r} (the connector's policy)",
                cluster=self._label(ref),
            )

    def _check_owner(self, ref: ClusterRef, obj: Dict[str, Any]) -> None:
        found = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_OWNER)
        if self.owner and found and found != self.owner and not self.allow_foreign:
            raise UnauthorizedError(
                f"cluster is labelled {LABEL_OWNER}={found!r}, not {self.owner!r}; "
                "pass allow_foreign=True to change another user's cluster",
                cluster=self._label(ref),
            )

    def _mutate(
        self, ref: ClusterRef, build: Callable[[Dict[str, Any]], Optional[Patch]], first: Optional[Dict[str, Any]] = None,
        deadline: Optional[Deadline] = None, where: Optional[Tuple[str, str]] = None,
    ) -> Tuple[Dict[str, Any], Dict[str, Any], bool]:
        """Read, build a patch, send it carrying the read's resourceVersion: (object before, object after,
        whether a patch was applied). One step, sent again by :func:`send` from a fresh read on a 409
        (``conflict_retries`` attempts, then :class:`ConflictError`) and through an outage until ``deadline``,
        so a patch applies once. ``build`` returning None: nothing to change, or, after a patch whose answer
        was lost, that it applied. ``where`` (plural, name): another object of the adapter's API group."""
        adapter = self._adapter(ref)
        plural, name = where if where is not None else (adapter.plural, adapter.object_name(ref))
        resource, namespace = self._resource(ref, plural), self._ns(ref)
        obj, unanswered = first, None
        """The object the next step starts from (None: read it), and the one a lost patch was built from."""

        def step() -> Tuple[Dict[str, Any], Dict[str, Any], bool]:
            nonlocal obj, unanswered
            current, obj = obj, None
            if current is None:
                current = self._read(ref, deadline, ONCE) if where is None else self.api.read_object(
                    resource, namespace, name, deadline, ONCE
                )
            self._check_owner(ref, current)
            patch = build(current)
            if patch is None:
                return (unanswered, current, True) if unanswered is not None else (current, current, False)
            patch.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
            try:
                after = self.api.patch_object(resource, namespace, name, patch, deadline, ONCE)
            except TransientError:
                unanswered = unanswered or current
                raise
            self._noted(ref, plural, name, after)  # a state read from the cache must not answer from before it
            return current, after, True

        rule = RetryRule(ride_out=True, conflicts=self.conflict_retries - 1)
        try:
            return send(step, tracker=self.api.outage, rule=rule, deadline=deadline, what=f"patch {plural} {name}")
        except Conflict:
            raise ConflictError(
                f"the cluster kept changing under {self.conflict_retries} attempts to patch it", cluster=self._label(ref),
            ) from None

    def _elsewhere(self, ref: ClusterRef, deadline: Deadline) -> Callable[..., Dict[str, Any]]:
        """The :data:`~.resources.base.Mutate` an adapter uses to change the other objects sizing ``ref``."""

        def mutate(plural: str, name: str, build: Callable[[Dict[str, Any]], Optional[Patch]]) -> Dict[str, Any]:
            return self._mutate(ref, build, deadline=deadline, where=(plural, name))[1]

        return mutate

    def _hold_elsewhere(self, ref: ClusterRef, names: Tuple[str, ...], replicas: int, deadline: Deadline) -> None:
        if names:
            self._adapter(ref).hold_elsewhere(self._full(ref), names, replicas, self._elsewhere(ref, deadline))

    def _restore_elsewhere(self, ref: ClusterRef, deadline: Deadline) -> None:
        self._adapter(ref).restore_elsewhere(self._full(ref), self.api, deadline, self._elsewhere(ref, deadline))

    def _bookkeeping_deadline(self) -> Deadline:
        """How long a claim, release or baseline record (no timeout of their own) rides out an outage:
        ``request_timeout``, so a phase ending during an API server restart still releases its claim."""
        return Deadline(self.request_timeout)

    def _with_baseline(
        self, ref: ClusterRef, obj: Dict[str, Any], patch: Patch, change: Optional[RecordChange] = None
    ) -> Patch:
        """``patch`` (a change to the cluster) with the records ``change`` writes, by default a missing
        baseline recorded (:func:`~flytekitplugins_ddlscale._core.claimrules.baseline_before_change`)."""
        if change is None:
            record = decode_record(obj)
            change = RecordChange(baseline=claimrules.baseline_before_change(ClusterRecords(
                baseline=record[0] if record else None
            )))
        notes = self._adapter(ref).notes(obj, None, patch.get("spec") or {}, False)
        notes.update(self._record_notes(ref, obj, change))
        if notes:
            patch.setdefault("metadata", {}).setdefault("annotations", {}).update(notes)
        return patch

    def _record_notes(self, ref: ClusterRef, obj: Dict[str, Any], change: RecordChange) -> Patch:
        """The annotation changes writing ``change`` on ``obj`` (a size to record is ``obj``'s, read once)."""
        notes: Patch = {}
        if change.claims is not None:
            notes[CLAIMS_ANNOTATION] = encode_claims(change.claims) if change.claims else None
        recorded: Optional[str] = None
        for annotation, size in ((BASELINE_ANNOTATION, change.baseline), (OUTSIDE_ANNOTATION, change.outside)):
            if size is Size.FORGET:
                notes[annotation] = None
            elif size is Size.RECORD:
                recorded = recorded or encode_record(*self._adapter(ref).baseline(self._full(ref), obj))
                notes[annotation] = recorded
        return notes

    def _size(self, ref: ClusterRef, obj: Dict[str, Any], sizing: Sizing, pods: List[Dict[str, Any]]) -> Tuple[Patch, int, bool]:
        """The spec fragment setting ``sizing`` (held against the operator's autoscaler), effective count, capped."""
        return self._adapter(ref).size_spec(self._full(ref), obj, sizing, self._workers(ref, pods), decode_record(obj))

    def _size_setting(self, ref: ClusterRef) -> str:
        return self._adapter(ref).size_setting(ref)

    def _state(self, ref: ClusterRef, obj: Dict[str, Any], pods: List[Dict[str, Any]]) -> ClusterState:
        return self._adapter(ref).state(self._full(ref), obj, pods)

    def connection_env(self, ref: ClusterRef) -> Dict[str, str]:
        """The variables code uses to reach ``ref``'s head: empty for Domino's kinds (Domino injects
        them), the scheduler service for ``dask-operator``, ``RAY_ADDRESS`` for ``kuberay``."""
        self._served(ref)
        return self._adapter(ref).connection_env(ref, self._ns(ref))

    # -- protocol hooks ----------------------------------------------------
    def _observe(self, ref: ClusterRef, reads: Optional[SharedReads] = None) -> ClusterState:
        """Spec and status from the object, workers and head from the pods, bounds from the
        operator's autoscaler where it is another object (the Dask operator's DaskAutoscaler); with
        ``reads``, each from the shared caches where they answer, the others within its budget."""
        deadline, linger = (reads.deadline(), reads.linger) if reads is not None else (None, None)
        try:
            obj = self._observed(ref, deadline, linger)
        except NotCreatedYet as missing:
            missing.state = missing.pending_state(self._label(ref))
            raise
        state = self._state(ref, obj, self._pods(ref, deadline=deadline, linger=linger or 0.0))
        return self._adapter(ref).observe_elsewhere(ref, self._ns(ref), self.api, deadline, state, linger)

    _shared_state = _observe

    def cached_state(self, ref: ClusterRef, reads: SharedReads) -> Optional[ClusterState]:
        """The state from the running, synced informers alone (kept ``reads.linger`` seconds more)."""
        ref = self._served(ref)
        if self._api is None:
            return None
        adapter, namespace = self._adapter(ref), self._ns(ref)
        obj = cached_object(self._api, namespace, self._resource(ref), adapter.object_name(ref), reads.linger, False)
        pods = cached_pods(self._api, namespace, self._selector(ref), reads.linger, 0.0, start=False)
        if obj is None or pods is None:
            return None
        return adapter.cached_elsewhere(ref, namespace, self._api, self._state(ref, obj, pods), reads.linger)

    def _check_tier(self, ref: ClusterRef, tier: Optional[str], field: str) -> Optional[str]:
        self._adapter(ref).check_tier(ref, tier, field)
        resolved = self._resolve(tier, ref.kind, field)
        return resolved.name if resolved is not None else tier

    def _check_head_tier(self, ref: ClusterRef, tier: Optional[str], field: str) -> None:
        self._adapter(ref).check_tier(ref, tier, field)
        if layout_of(ref).head_section is None and tier is not None:
            raise InvalidInputError(field, tier, "None for MPI clusters (no head)")
        self._resolve(tier, ref.kind, field)

    def _scale_change(
        self, ref: ClusterRef, replicas: int, worker_hw_tier: Optional[str], strict: bool, deadline: Deadline
    ) -> Change:
        """One merge patch sets the count (held against the HPA) and tier and records the baseline."""
        tier = self._resolve(worker_hw_tier, ref.kind, "worker_hw_tier")
        what = f"the scale of {self._label(ref)} to {replicas} workers to be applied"
        obj, pods, previous = self._opening(ref, deadline, what)
        outcome = Outcome(requested=replicas, tier=tier.id if tier else None, tier_name=worker_hw_tier)
        with self._until(ref, deadline, what, previous):
            wanted, capped, others = self._adapter(ref).before_change(self._full(ref), self.api, deadline, replicas, strict)
            if previous.existing_workers > wanted:
                pods = self._marked_idle(ref, pods, deadline)

            def build(current: Dict[str, Any]) -> Optional[Patch]:
                spec, outcome.effective, outcome.capped = self._size(ref, current, Sizing(wanted, strict, tier), pods)
                outcome.capped = outcome.capped or capped
                return self._with_baseline(ref, current, {"spec": spec})

            # Size (and baseline) first, autoscaler second: a failure between leaves the
            # autoscaler free to shrink the group back within its own bounds, never to grow it.
            _, after, _ = self._mutate(ref, build, obj, deadline)
            self._hold_elsewhere(ref, others, outcome.effective, deadline)
        return self._change(ref, outcome, previous, after, deadline)

    def _change(
        self, ref: ClusterRef, outcome: Outcome, previous: ClusterState, after: Dict[str, Any], deadline: Deadline
    ) -> Change:
        """A sent patch, with what its wait needs: the tier id new workers carry, the object it left."""
        assert outcome.requested is not None
        result = ScaleResult.sent(
            self._label(ref), previous, outcome.requested, outcome.effective, capped=outcome.capped,
            worker_hw_tier=outcome.tier_name,
        )
        return Change(result, restoring=outcome.restoring, detail=_Patched(outcome.tier, after, deadline))

    def _unwaited(self, ref: ClusterRef, change: Change) -> ClusterState:
        deadline = Deadline(change.detail.deadline.left_for_wait())
        with self._until(ref, deadline, f"the pods of {self._label(ref)} after the change", None):
            return self._state(ref, change.detail.after, self._pods(ref, deadline=deadline))

    def _final_state(self, ref: ClusterRef, deadline: Deadline, what: str) -> ClusterState:
        """The cluster at the end of an operation, riding out an outage for what is left of ``deadline``
        (at least :data:`~flytekitplugins_ddlscale._core.waiting.MIN_STATE_READ`); then a timeout waiting for ``what``."""
        left = Deadline(deadline.left_for_state_read())
        with self._until(ref, left, what, None):
            return self._state(ref, self._read(ref, left), self._pods(ref, deadline=left))

    def _observe_for_wait(self, ref: ClusterRef, replicas: int, deadline: Deadline) -> Optional[ClusterState]:
        """The object and its pods at the start of a wait (so an error about it reports the head and
        the workers as they are); None while the API server cannot be read (the wait rides out the
        outage), unless that read already used up the deadline."""
        try:
            with self._until(ref, deadline, f"{replicas} Ready workers on {self._label(ref)}", None):
                return self._state(ref, self._read(ref, deadline), self._pods(ref, deadline=deadline))
        except NotCreatedYet as missing:
            return missing.pending_state(self._label(ref))
        except TransientError:
            return None

    def _reach(self, ref: ClusterRef) -> Reach:
        """How ``ddlscale`` and a new process reach this cluster (its records are on the object)."""
        env: Dict[str, str] = {}
        options: Dict[str, str] = {}
        if self._kubeconfig:
            env[settings.KUBECONFIG.name] = options["kubeconfig"] = self._kubeconfig
        if self._context:
            # The CLI has no context flag: only the Python call can choose one.
            options["context"] = self._context
        return Reach(self.name, self._full(ref), env=env, options=options, cli=not self._context)

    def _wait_workers(self, ref: ClusterRef, wait: WorkersWait) -> ClusterState:
        """Watch the cluster's pods (the head's too, for the state) until ``wait.replicas`` workers are Ready on
        the tier its change set and the spec agrees (:func:`~flytekitplugins_ddlscale.models.workers_reached`);
        only workers are counted and can end the wait by failing."""
        replicas = wait.replicas
        tier_id = wait.change.detail.tier_id if wait.change is not None else None
        state_with = self._state_with(ref)
        is_member = self._selects(ref, "worker")

        def check(
            pods: Dict[str, Dict[str, Any]], fresh: bool, deadline: Deadline
        ) -> Tuple[bool, ClusterState, int]:
            state = state_with(pods, fresh, deadline)
            ready = sum(
                1 for p in pods.values()
                if is_member(p) and pod_ready(p)
                and (tier_id is None or p["metadata"].get("labels", {}).get(LABEL_HW_TIER) == tier_id)
            )
            # A shrink is also done only once the extra pods are gone (not just not Ready).
            done = state.workers_up(replicas, ready) and (
                state.desired_workers != replicas or state.existing_workers == replicas
            )
            return done, state, ready

        def lingering(pods: Dict[str, Dict[str, Any]], state: ClusterState) -> str:
            members = sorted((name, pod_terminating(p)) for name, p in pods.items() if is_member(p))
            if len(members) <= replicas or state.desired_workers != replicas:
                return ""
            running = [name for name, terminating in members if not terminating]
            stopping = [name for name, terminating in members if terminating]
            return (
                f"; the scale-down is not done: {len(members)} worker pods for {replicas} wanted, still running: "
                f"{', '.join(running) or 'none'}"
                + (f"; terminating: {', '.join(stopping)}" if stopping else "")
                + f"; likely cause: {self._adapter(ref).removal}"
            )

        waiter = PodWaiter(
            self.api, self._ns(ref), self._selector(ref),
            what=f"{replicas} Ready workers on {self._label(ref)}", target=replicas, timeout=wait.timeout,
            grace=self.failure_grace, watched=is_member, progress=wait.progress, cluster=self._label(ref),
            last=wait.last, explain=lingering,
        )
        return self._run_wait(ref, waiter, check)

    def _state_with(self, ref: ClusterRef) -> Callable[[Dict[str, Dict[str, Any]], bool, Deadline], ClusterState]:
        """A pod wait's view of ``ref``: the state with the pods it sees and the object, read again when the
        check is ``fresh`` (from the shared cache where it can answer, :meth:`_run_wait`), else the cache's
        latest copy; the server is asked once the cache no longer holds it (deleted: not found at once)."""
        read: Dict[str, Dict[str, Any]] = {}
        name = self._adapter(ref).object_name(ref)

        def state_with(pods: Dict[str, Dict[str, Any]], fresh: bool, deadline: Deadline) -> ClusterState:
            if not fresh and "obj" in read:
                cached = cached_object(self.api, self._ns(ref), self._resource(ref), name, 0.0)
                if cached is not None:
                    read["obj"] = cached
                else:
                    fresh = cache_lacks(self.api, self._ns(ref), self._resource(ref), name)
            if fresh or "obj" not in read:
                # At the deadline the server is asked: a timeout reports what it says, or that it did not answer.
                try:
                    read["obj"] = self._read(ref, deadline) if deadline.expired else self._observed(
                        ref, deadline, linger=WAIT_LINGER
                    )
                except NotCreatedYet as missing:
                    return missing.pending_state(self._label(ref))
            return self._state(ref, read["obj"], list(pods.values()))

        return state_with

    def _run_wait(self, ref: ClusterRef, waiter: PodWaiter, check: Check) -> ClusterState:
        """``waiter`` run, woken by its pods and by ``ref``'s object too, whose shared cache is kept for the wait
        (and :data:`~._informer.WAIT_LINGER` seconds after), so its object reads after the first come from it."""
        waiter.changed = threading.Event()
        held = hold(self.api, self._ns(ref), self._resource(ref), self._adapter(ref).object_name(ref), waiter.changed)
        try:
            return waiter.run(check)
        finally:
            if held is not None:
                held.close(WAIT_LINGER)

    def _selects(self, ref: ClusterRef, role: str) -> Callable[[Dict[str, Any]], bool]:
        """Whether a pod is one of ``ref``'s ``role`` pods (by its labels)."""
        requirements = parse_selector(self._selector(ref, role))
        return lambda pod: matches(requirements, pod_labels(pod))

    def _restart_head(
        self, ref: ClusterRef, head_hw_tier: Optional[str], wait: bool, deadline: Deadline,
        progress: Optional[ProgressReporter],
    ) -> RestartResult:
        """Roll the head onto ``head_hw_tier`` by patching the head section, or delete it so its
        StatefulSet recreates it; MPI clusters have no head (:class:`UnsupportedOperationError`)."""
        info = layout_of(ref)
        if info.head_section is None:
            raise UnsupportedOperationError(
                f"{info.crd_kind} clusters have no head to restart", cluster=self._label(ref)
            )
        self._adapter(ref).check_tier(ref, head_hw_tier, "head_hw_tier")
        tier = self._resolve(head_hw_tier, ref.kind, "head_hw_tier")
        what = f"the head restart of {self._label(ref)} to be sent"
        obj, pods, previous = self._opening(ref, deadline, what, "head")
        with self._until(ref, deadline, what, previous):
            heads = [p for p in pods if not pod_terminating(p)]
            if not heads:
                raise ClusterNotFoundError(f"no {info.head_component} pod found", cluster=self._label(ref))
            old = max(heads, key=lambda p: p["metadata"].get("creationTimestamp", ""))
            old_name, old_uid = old["metadata"]["name"], old["metadata"]["uid"]
            started_at = utcnow().isoformat()
            patched = False
            if tier is not None:

                def build(current: Dict[str, Any]) -> Optional[Patch]:
                    spec = self._adapter(ref).head_tier_spec(current, tier)
                    return None if spec is None else self._with_baseline(ref, current, {"spec": spec})

                _, _, patched = self._mutate(ref, build, obj, deadline)
            if not patched:
                try:
                    self.api.delete_pod(self._ns(ref), old_name, old_uid, deadline)
                except (Conflict, ClusterNotFoundError):
                    pass  # already replaced by someone else: the wait below still needs a new Ready head
        begun = time.monotonic()
        if wait:
            state = self._wait_head(ref, old_uid, tier.id if tier else None, deadline.left_for_wait(), progress)
        else:
            state = self._final_state(ref, deadline, f"the state of {self._label(ref)} after its head restart")
        waited, seconds = bool(wait), time.monotonic() - begun if wait else 0.0
        return RestartResult(self._label(ref), old_name, started_at, waited, state, waited, seconds, head_hw_tier, old_uid)

    def _head_restarted(
        self, ref: ClusterRef, restart: RestartResult, reads: Optional[SharedReads]
    ) -> Tuple[bool, ClusterState]:
        """A Ready head pod other than the one replaced (by uid), on the requested tier if one was."""
        if not restart.replaced_uid:
            raise InvalidInputError("restart.replaced_uid", restart.replaced_uid, "the uid restart_head returned")
        tier = self._resolve(restart.head_hw_tier, ref.kind, "head_hw_tier")
        deadline, linger = (reads.deadline(), reads.linger) if reads is not None else (None, None)
        state = self._state(ref, self._observed(ref, deadline, linger), self._pods(ref, None, deadline, linger or 0.0))
        heads = self._pods(ref, "head", deadline, linger or 0.0)
        return any(_new_head(p, restart.replaced_uid, tier.id if tier else None) for p in heads), state

    def _wait_head(
        self, ref: ClusterRef, old_uid: str, tier_id: Optional[str], timeout: float,
        progress: Optional[ProgressReporter],
    ) -> ClusterState:
        state_with = self._state_with(ref)
        is_head = self._selects(ref, "head")

        def fresh_head(pod: Dict[str, Any]) -> bool:
            return is_head(pod) and pod["metadata"].get("uid") != old_uid

        def check(
            pods: Dict[str, Dict[str, Any]], fresh: bool, deadline: Deadline
        ) -> Tuple[bool, ClusterState, int]:
            state = state_with(pods, fresh, deadline)
            # Every pod of the cluster is watched: only a head pod counts.
            ready = any(fresh_head(p) and _new_head(p, old_uid, tier_id) for p in pods.values())
            return ready, state, int(ready)

        # All the cluster's pods, so the state the wait ends with counts the workers too.
        waiter = PodWaiter(
            self.api, self._ns(ref), self._selector(ref),
            what=f"a new Ready {layout_of(ref).head_component} pod on {self._label(ref)}", target=1, timeout=timeout,
            grace=self.failure_grace, watched=fresh_head, progress=progress, cluster=self._label(ref),
        )
        return self._run_wait(ref, waiter, check)

    def _record_baseline(self, ref: ClusterRef) -> Baseline:
        """Record the size, autoscaling section and tiers in the cluster's annotation, unless recorded."""

        def build(current: Dict[str, Any]) -> Optional[Patch]:
            return None if decode_record(current) else self._with_baseline(ref, current, {})

        _, after, _ = self._mutate(ref, build, deadline=self._bookkeeping_deadline())
        record = decode_record(after)
        assert record is not None
        return record[0]

    def _get_baseline(self, ref: ClusterRef) -> Optional[Baseline]:
        """The baseline recorded on the cluster object, or None."""
        record = decode_record(self._read(ref))
        return record[0] if record else None

    def _restore_change(
        self, ref: ClusterRef, target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Union[Change, ScaleResult]:
        """Put back the recorded replicas, autoscaling section and tiers (or ``target``), in one
        patch that also removes the baseline annotation. Without a baseline or target nothing changes.
        """
        restoring = self._restoring(ref, target)
        what = f"the restore of {self._label(ref)} to be applied"
        obj, pods, previous = self._opening(ref, deadline, what, idle=True)
        outcome = Outcome(previous.desired_workers, requested=previous.desired_workers, restoring=True)

        def build(current: Dict[str, Any]) -> Optional[Patch]:
            record = decode_record(current)
            decided, dropped = claimrules.restore(_records_on(current))
            notes = self._record_notes(ref, current, decided)
            if record is None and target is None and not notes:
                return None  # what an earlier build whose answer was lost dropped stays reported
            outcome.dropped = dropped
            if record is None and target is None:
                return {"metadata": {"annotations": notes}}
            spec = self._restore_spec(ref, current, record, restoring, outcome, pods)
            notes.update(self._adapter(ref).notes(current, record, spec, True))
            return {"spec": spec, "metadata": {"annotations": notes}} if notes else {"spec": spec}

        with self._until(ref, deadline, what, previous):
            # The autoscaler first, the worker group (which drops the record) last: a failure
            # between leaves the record, so repeating the restore finishes it, and the autoscaler
            # already back at its own minimum can only shrink the group, never hold it larger.
            self._restore_elsewhere(ref, deadline)
            _, after, patched = self._mutate(ref, build, obj, deadline)
        if outcome.dropped:
            logger.warning("%s: restore dropped claims %s", self._label(ref), ", ".join(outcome.dropped))
        if not patched:
            return ScaleResult.sent(self._label(ref), previous, previous.desired_workers, previous.desired_workers)
        return self._change(ref, outcome, previous, after, deadline)

    def _restoring(self, ref: ClusterRef, target: Optional[ReplicaSpec]) -> Restoring:
        """A restore to ``target`` (else the recorded size) with its tiers resolved (checked by the base before)."""
        if target is None:
            return Restoring()
        return Restoring(
            target,
            self._resolve(target.worker_hw_tier, ref.kind, "target.worker_hw_tier"),
            self._resolve(target.head_hw_tier, ref.kind, "target.head_hw_tier"),
        )

    def _reconcile_change(
        self, ref: ClusterRef, target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Optional[Change]:
        """ONE merge patch carrying the resourceVersion of the read its claims came from (a concurrent claim
        makes it 409: decided again from a fresh read); it drops dead claims and, with no claim live, the
        record of the size outside phases it puts back (and the baseline when the same size)."""
        restoring = self._restoring(ref, target)
        what = f"the reconcile of {self._label(ref)} to be applied"
        obj, pods, previous = self._opening(ref, deadline, what, idle=True)
        outcome = Outcome()

        def build(current: Dict[str, Any]) -> Optional[Patch]:
            nonlocal outcome
            record, outside = decode_record(current), decode_record(current, OUTSIDE_ANNOTATION)
            decided = claimrules.settle(
                _records_on(current), lambda name, observed: self._same_tier(ref, name, observed)
            )
            sent, outcome = outcome, Outcome(restoring=decided.hold is None, dead=decided.dead)
            if decided.hold is not None:
                tier = self._resolve(decided.hold.worker_hw_tier, ref.kind, "worker_hw_tier")
                wanted, capped, outcome.others = self._adapter(ref).before_change(
                    self._full(ref), self.api, deadline, decided.replicas, False
                )
                spec, outcome.effective, outcome.capped = self._size(ref, current, Sizing(wanted, tier=tier), pods)
                outcome.capped = outcome.capped or capped
                if tier is not None:
                    outcome.tier, outcome.tier_name = tier.id, decided.hold.worker_hw_tier
                outcome.requested = decided.replicas
                return self._with_baseline(ref, current, {"spec": spec}, decided.change)
            notes = self._record_notes(ref, current, decided.change)
            recorded = outside or record
            if recorded is None:
                if sent.requested is not None:
                    # After a lost answer this re-read finds the restore sent before applied: keep what it decided.
                    outcome = sent
                return {"metadata": {"annotations": notes}} if notes else None
            spec = self._restore_spec(ref, current, recorded, restoring, outcome, pods)
            notes.update(self._adapter(ref).notes(current, recorded, spec, True))
            return {"spec": spec, "metadata": {"annotations": notes}}

        claimed = bool(claimrules.live_claims(_claims_on(obj)))
        with self._until(ref, deadline, what, previous):
            # Same order as scale and restore: the autoscaler is released before the worker
            # group's record goes, and held only after the worker group is sized.
            if not claimed:
                self._restore_elsewhere(ref, deadline)
            _, after, patched = self._mutate(ref, build, obj, deadline)
            if outcome.requested is not None and not outcome.restoring:
                self._hold_elsewhere(ref, outcome.others, outcome.effective, deadline)
            elif outcome.requested is not None and claimed:
                self._restore_elsewhere(ref, deadline)
        if patched:
            log_dropped(self._label(ref), outcome.dead)
        if not patched or outcome.requested is None:
            return None
        return self._change(ref, outcome, previous, after, deadline)

    def _same_tier(self, ref: ClusterRef, name: str, observed: Optional[str]) -> bool:
        """A claim's tier NAME against the tier id label a recorded size shows."""
        if name == observed:
            return True
        try:
            tier = self._resolve(name, ref.kind, "worker_hw_tier")
        except ScalingError:
            return False
        return tier is not None and tier.id == observed

    def _restore_spec(
        self, ref: ClusterRef, obj: Dict[str, Any], record: Optional[Tuple[Baseline, Dict[str, Any]]],
        restoring: Restoring, outcome: Outcome, pods: List[Dict[str, Any]],
    ) -> Patch:
        """The spec fragment putting back ``record`` (or setting the target); ``outcome`` says what it asks for:
        the target's replicas and tier, else the recorded size."""
        target = restoring.target
        spec = self._adapter(ref).restore_spec(self._full(ref), obj, record, restoring, outcome, self._workers(ref, pods))
        outcome.requested = target.replicas if target is not None else outcome.effective
        outcome.tier_name = target.worker_hw_tier if target is not None else None
        return spec

    def _claim(
        self, ref: ClusterRef, claim_id: str, replicas: int, worker_hw_tier: Optional[str], lease_seconds: float,
        timeout: Optional[float],
    ) -> Claim:
        """Add ``claim_id`` to the claims annotation (:func:`~flytekitplugins_ddlscale._core.claimrules.claim`:
        dead claims dropped, the baseline and, for the first live phase, the size outside phases recorded in
        the same patch); return the largest live claim."""
        change: RecordChange
        largest: Claim

        def build(current: Dict[str, Any]) -> Optional[Patch]:
            nonlocal change, largest
            self._adapter(ref).check_size(self._full(ref), current, replicas)
            new = Claim(claim_id, replicas, worker_hw_tier, lease_seconds=lease_seconds)
            change, largest = claimrules.claim(_records_on(current), new)
            return self._with_baseline(ref, current, {}, change)

        deadline = Deadline(timeout) if timeout is not None else self._bookkeeping_deadline()
        self._mutate(ref, build, deadline=deadline)
        log_dropped(self._label(ref), change.dead)
        return largest

    def _renew(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Renew ``claim_id`` in the claims annotation; None (and no patch) when it is gone."""
        return self._claims_patch(ref, lambda claims: claimrules.renew(claims, claim_id))

    def _release(self, ref: ClusterRef, claim_id: str) -> Optional[Claim]:
        """Remove ``claim_id`` from the claims annotation; return the largest remaining claim or None."""
        return self._claims_patch(ref, lambda claims: claimrules.release(claims, claim_id))

    def _claims_patch(
        self, ref: ClusterRef, rule: Callable[[Dict[str, Claim]], Tuple[RecordChange, Optional[Claim]]]
    ) -> Optional[Claim]:
        """Apply ``rule`` to the claims annotation in one resourceVersion-checked patch (none when it changes
        nothing); return the claim it answers from the last read."""
        answer: Optional[Claim]

        def build(current: Dict[str, Any]) -> Optional[Patch]:
            nonlocal answer
            change, answer = rule(_claims_on(current))
            return {"metadata": {"annotations": self._record_notes(ref, current, change)}} if change.writes else None

        self._mutate(ref, build, deadline=self._bookkeeping_deadline())
        return answer

    def _claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        """The live claims in the cluster's claims annotation, by claim id (dead ones not counted)."""
        return claimrules.live_claims(_claims_on(self._read(ref)))

    def _recorded_claims(self, ref: ClusterRef) -> Dict[str, Claim]:
        return _claims_on(self._read(ref))

    def close(self) -> None:
        """Close the connection pool if this backend created the client."""
        with self._lock:
            if self._api is not None and self._given_client is None:
                self._api.close()
            self._api = None


def _tier_catalog_from_env(tiers_file: Optional[str], field: str, wanted: str) -> TierCatalog:
    """``tiers_file``, else Domino via ``$DOMINO_API_PROXY``, else ``$DDLSCALE_TIERS_FILE``; else
    :class:`InvalidInputError` naming ``field``."""
    if tiers_file:
        return FileTierCatalog(tiers_file)
    proxy = settings.DOMINO_API_PROXY.value()
    if proxy:
        from .._support.domino_auth import DominoAuth

        return DominoTierCatalog(proxy, auth=DominoAuth())
    from_env = settings.TIERS_FILE.value()
    if from_env:
        return FileTierCatalog(from_env)
    raise InvalidInputError(
        field, wanted, f"a hardware tier from a catalog; configure one with tier_catalog=, tiers_file=, "
        f"${settings.DOMINO_API_PROXY.name} or ${settings.TIERS_FILE.name}",
    )
