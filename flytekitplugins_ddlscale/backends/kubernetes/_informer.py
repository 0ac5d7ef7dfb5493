"""Shared list+watch caches per API server, namespace and resource, for every wait and poll in this process.

An :class:`Informer` is one thread that lists, then watches, keeping a trimmed cache (:func:`trim`); pod
waits subscribe with their label selector, cluster objects are read only from a copy at least as new as
this process last wrote or read (:func:`note_version`). A 410 re-lists once for all readers, an outage is
ridden out; an informer stops :data:`WAIT_LINGER` s (or a caller's ``linger``) after its last reader
leaves. docs/kubernetes.md, Shared reads and many waits in one process.
"""
import copy
import hashlib
import logging
import re
import threading
import time
from collections import OrderedDict
from typing import (
    Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Set, Tuple, TypeVar, Union,
)

from ...errors import BackendUnavailableError, InvalidInputError, ScalingError, TransientError, UnauthorizedError
from ..._core.lifetime import Closing, at_exit_once
from ..._core.outage import ONCE, OUTAGE_BACKOFF
from ._api import PODS, BearerFromFile, KubeApi, Resource, WatchExpired
from ._spec import pod_labels

logger = logging.getLogger("flytekitplugins_ddlscale.kubernetes")

WATCH_WINDOW = 30.0
"""Longest single watch request (seconds); the watch resumes from the last version after it."""
WAIT_LINGER = 1.0
"""Seconds an informer stays after its last wait ends, so waits that follow each other (a busy
process, a phase's scale then wait) reuse the cache instead of listing again."""
KEPT = 4096
"""Objects whose version :class:`VersionsSeen` keeps before the least recently touched is forgotten."""
REFUSED_RETRY = 300.0
"""Seconds cluster-object reads go to the server after their informer was refused (RBAC without
list/watch, a resource not served) before a new informer is tried."""
Pod = Dict[str, Any]
Requirement = Tuple[str, str, Union[str, FrozenSet[str], None]]
"""(key, op, value): op is "=", "!=", "exists", "!" (absent), "in" or "notin" (value: the set)."""


Key = Tuple[str, str, str, Resource]
_KEPT_METADATA = (
    "name", "namespace", "uid", "resourceVersion", "generation", "labels", "annotations", "creationTimestamp",
    "deletionTimestamp",
)
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_POD_STATUS = ("phase", "podIP", "conditions", "containerStatuses", "initContainerStatuses")


def trim(resource: Resource, obj: Dict[str, Any]) -> Dict[str, Any]:
    """``obj`` with only what a state is built from, so a namespace's cache stays small: metadata without
    ``managedFields`` or kubectl's last-applied copy; a pod's status, no spec; a cluster object's status
    and its spec's values, each section's own values and labels, lists as they are. Never patched from."""
    meta = obj.get("metadata") or {}
    kept: Dict[str, Any] = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    if resource.is_pods:
        kept.pop("annotations", None)
        status = obj.get("status") or {}
        return {"metadata": kept, "status": {k: status[k] for k in _POD_STATUS if k in status}}
    if _LAST_APPLIED in (kept.get("annotations") or {}):
        kept["annotations"] = {k: v for k, v in kept["annotations"].items() if k != _LAST_APPLIED}
    spec: Dict[str, Any] = {}
    for key, value in (obj.get("spec") or {}).items():
        if isinstance(value, dict):
            spec[key] = {k: v for k, v in value.items() if k == "labels" or not isinstance(v, (dict, list))}
        else:
            spec[key] = value
    out = {"metadata": kept, "spec": spec, "status": obj.get("status") or {}}
    for field in ("apiVersion", "kind"):
        if field in obj:
            out[field] = obj[field]
    return out


def at_least(version: str, floor: str) -> bool:
    """Whether resourceVersion ``version`` is ``floor`` or later. The API server's versions are
    etcd revisions (integers); any other pair is ordered only when equal (never trusted otherwise)."""
    if version == floor:
        return True
    return version.isdigit() and floor.isdigit() and int(version) >= int(floor)


def _ahead(floors: Dict[str, str], listed: Dict[str, Dict[str, Any]], version: str) -> Dict[str, str]:
    """The ``floors`` a new list (at ``version``) has not reached: one past the list was noted after it and
    stays until the watch brings it; an object the list lacks at or past its floor was deleted."""
    kept = {}
    for name, floor in floors.items():
        obj = listed.get(name)
        seen = str(obj["metadata"].get("resourceVersion", "")) if obj is not None else version
        if not at_least(seen, floor):
            kept[name] = floor
    return kept


_SET_REQUIREMENT = re.compile(r"([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)")


def _parts(selector: str) -> List[str]:
    """The comma-separated requirements of ``selector``; commas inside ``(...)`` belong to a set."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return [part for part in parts if part]


def parse_selector(selector: str) -> List[Requirement]:
    """The requirements of a label selector: equality-based (``a=b,c!=d,e,!f``) and set-based
    (``g in (x,y)``, ``h notin (z)``), as the API server reads them.

    Raises :class:`InvalidInputError` naming the selector for anything else."""
    requirements: List[Requirement] = []
    for part in _parts(selector):
        in_set = _SET_REQUIREMENT.fullmatch(part)
        if in_set:
            key, op, values = in_set.groups()
            requirements.append((key, op, frozenset(v.strip() for v in values.split(",") if v.strip())))
        elif "!=" in part:
            key, value = part.split("!=", 1)
            requirements.append((key.strip(), "!=", value.strip()))
        elif "=" in part:
            key, value = part.replace("==", "=").split("=", 1)
            requirements.append((key.strip(), "=", value.strip()))
        elif " " in part or "(" in part or ")" in part:
            raise InvalidInputError(
                "selector", selector, "label requirements: key=value, key!=value, key, !key, key in (a,b), key notin (a,b)"
            )
        elif part.startswith("!"):
            requirements.append((part[1:], "!", None))
        else:
            requirements.append((part, "exists", None))
    return requirements


def matches(requirements: List[Requirement], labels: Dict[str, str]) -> bool:
    """Whether ``labels`` satisfy every requirement."""
    for key, op, value in requirements:
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and key in labels and labels[key] == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!" and key in labels:
            return False
        if op in ("in", "notin") and (isinstance(value, frozenset) and labels.get(key) in value) != (op == "in"):
            return False
    return True


class Subscription(Closing):
    """One wait's view of the informer: the pods matching its selector, woken (:meth:`wait`) when they
    change, the informer re-lists or fails (:attr:`error`); close it, or use it as a context manager."""

    def __init__(
        self, informer: "Informer", selector: str, requirements: List[Requirement], passive: bool = False,
        changed: Optional[threading.Event] = None, name: Optional[str] = None,
    ) -> None:
        self.informer = informer
        self.passive = passive
        """A hold on the informer only (a cluster-object reader): never matched by selector."""
        self.name = name
        """The object a passive subscription is woken for (its events and re-lists), if any."""
        self.selector = selector
        self.requirements = requirements
        pairs = [(k, v) for k, op, v in requirements if op == "=" and v is not None]
        self.index: Optional[Tuple[str, str]] = pairs[-1] if pairs else None
        """A label this subscription requires, so events for other pods never touch it (the informer
        picks the most selective one)."""
        self.pods: Dict[str, Pod] = {}
        self.error: Optional[ScalingError] = None
        self.relisted = False
        """True after the informer replaced the cache by a new list (a 410): the caller re-reads the rest."""
        self._changed = changed if changed is not None else threading.Event()
        """Set on a change; a wait watching pods and its cluster object shares one between two subscriptions."""
        self._closed = False

    @property
    def synced(self) -> bool:
        """True once the informer's first list has arrived."""
        return self.informer.synced.is_set()

    def wait(self, timeout: float) -> bool:
        """Block until something changed or ``timeout`` seconds passed; True if something changed."""
        changed = self._changed.wait(max(0.0, timeout))
        self._changed.clear()
        return changed

    def wait_synced(self, timeout: float) -> bool:
        """Block until the first list arrived, the informer failed, or ``timeout`` passed; True if synced."""
        end = time.monotonic() + timeout
        while not self.synced and self.error is None:
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.wait(min(left, 0.5))
        return self.synced

    def snapshot(self) -> Dict[str, Pod]:
        """A copy of the matching pods by name (the pod objects are replaced, never changed, on events)."""
        with self.informer.lock:
            self.relisted = False
            return dict(self.pods)

    def _wake(self) -> None:
        self._changed.set()

    def close(self, linger: float = 0.0) -> None:
        """Leave the informer; it stops after ``linger`` seconds if no one else subscribes."""
        if not self._closed:
            self._closed = True
            self.informer.unsubscribe(self, linger)


class Informer:
    """A namespace's pods (or cluster objects of one kind) on one API server, listed once and watched
    for every reader."""

    def __init__(self, key: Key, api: KubeApi, namespace: str, resource: Resource = PODS) -> None:
        self.key = key
        self.api = api
        self.namespace = namespace
        self.resource = resource
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.last_error: Optional[ScalingError] = None
        """The last outage symptom (or refusal during an outage) while listing or watching, for a wait
        that times out in it."""
        self.error: Optional[ScalingError] = None
        """Why the informer stopped serving (a refusal), handed to every subscription."""
        self.lists = 0
        """Lists made (one to start, one per 410)."""
        self._pods: Dict[str, Pod] = {}
        self._by_label: Dict[Tuple[str, str], Set[str]] = {}
        self._subs: Set[Subscription] = set()
        self._by_index: Dict[Tuple[str, str], Set[Subscription]] = {}
        self._unindexed: Set[Subscription] = set()
        self._named: Dict[str, Set[Subscription]] = {}
        self._version = ""
        self._floors: Dict[str, str] = {}
        """Per object: the latest resourceVersion this process wrote or read from the server; the cache
        answers for the object only once its copy is at least that new."""
        self._idle_until: Optional[float] = None
        self._stopping = threading.Event()
        self._response: Any = None
        self._timer: Optional[threading.Timer] = None
        self._thread = threading.Thread(
            target=self._run, name=f"ddlscale-informer-{namespace}-{resource.plural}", daemon=True
        )

    # -- subscribers -------------------------------------------------------
    def subscribe(self, selector: str, changed: Optional[threading.Event] = None) -> Subscription:
        """A new subscription for pods matching ``selector``; filled at once if the cache is synced;
        ``changed`` is set on every change (else the subscription's own event)."""
        sub = Subscription(self, selector, parse_selector(selector), changed=changed)
        with self.lock:
            sub.error = self.error
            self._subs.add(sub)
            self._index(sub)
            if self.synced.is_set():
                sub.pods = self._matching(sub)
                sub._wake()
        return sub

    def hold(self, name: Optional[str] = None, changed: Optional[threading.Event] = None) -> Subscription:
        """A passive subscription: keeps the informer running for a reader of objects by name; with
        ``name``, woken (``changed`` set) when that object changes or goes, or the cache is re-listed."""
        sub = Subscription(self, "", [], passive=True, changed=changed, name=name)
        with self.lock:
            sub.error = self.error
            self._subs.add(sub)
            if name is not None:
                self._named.setdefault(name, set()).add(sub)
        return sub

    def lacks(self, name: str) -> bool:
        """Whether the synced cache holds no object ``name`` (deleted, or created after the cache last
        heard: the caller asks the server), as opposed to being unable to answer."""
        with self.lock:
            return self.synced.is_set() and self.error is None and name not in self._pods

    def fresh(self, name: str) -> Optional[Dict[str, Any]]:
        """The cached copy of object ``name``, or None where the cache cannot answer: not synced,
        failed, the object absent (never listed, or deleted), or older than the last version this
        process saw of it (:meth:`note`)."""
        with self.lock:
            if not self.synced.is_set() or self.error is not None:
                return None
            obj = self._pods.get(name)
            if obj is None:
                return None
            floor = self._floors.get(name)
            if floor is not None:
                if not self._reached(name, floor):
                    return None
                del self._floors[name]
            return obj

    def fresh_all(self) -> Optional[List[Dict[str, Any]]]:
        """Every cached object, or None where the cache cannot answer for all of them: not synced,
        failed, or behind the last version this process saw of any object (one not yet listed
        included: the list would lack it)."""
        with self.lock:
            if not self.synced.is_set() or self.error is not None:
                return None
            self._floors = {name: floor for name, floor in self._floors.items() if not self._reached(name, floor)}
            if self._floors:
                return None
            return list(self._pods.values())

    def _reached(self, name: str, floor: str) -> bool:
        # Under the lock: whether the cached copy of ``name`` is at ``floor`` or later.
        obj = self._pods.get(name)
        return obj is not None and at_least(str(obj["metadata"].get("resourceVersion", "")), floor)

    def note(self, name: str, version: str) -> None:
        """This process wrote or read ``name`` at ``version``: the cache answers for it only from then on."""
        with self.lock:
            if self._reached(name, version):
                return
            floor = self._floors.get(name)
            if floor is None or not at_least(floor, version):
                self._floors[name] = version

    def _index(self, sub: Subscription) -> None:
        # Under the lock. The most selective required label (fewest pods in the cache), so an event
        # touches the few waits on that pod's cluster, not every wait of the kind.
        pairs = [(k, v) for k, op, v in sub.requirements if op == "=" and v is not None]
        if pairs and self.synced.is_set():
            sub.index = min(pairs, key=lambda pair: len(self._by_label.get(pair, ())))
        if sub.index is None:
            self._unindexed.add(sub)
        else:
            self._by_index.setdefault(sub.index, set()).add(sub)

    def _unindex(self, sub: Subscription) -> None:
        self._unindexed.discard(sub)
        if sub.index is not None:
            group = self._by_index.get(sub.index)
            if group is not None:
                group.discard(sub)
                if not group:
                    del self._by_index[sub.index]

    def unsubscribe(self, sub: Subscription, linger: float) -> None:
        """Drop ``sub``; the last one out stops the informer (after ``linger`` seconds)."""
        with self.lock:
            self._subs.discard(sub)
            if not sub.passive:
                self._unindex(sub)
            elif sub.name is not None:
                named = self._named.get(sub.name, set())
                named.discard(sub)
                if not named:
                    self._named.pop(sub.name, None)
            if self._subs:
                return
            now = time.monotonic()
            self._idle_until = max(self._idle_until or now, now + linger)
            left = self._idle_until - now
        if left <= 0:
            _REGISTRY.retire(self)
        else:
            self._arm(left)

    def _arm(self, seconds: float) -> None:
        # One timer at a time: reads that extend the linger (a connector's every poll) start none.
        with self.lock:
            if self._timer is not None:
                return
            self._timer = threading.Timer(seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        with self.lock:
            self._timer = None
            left = None if self._subs or self._idle_until is None else self._idle_until - time.monotonic()
        if left is None:
            return
        if left <= 0:
            _REGISTRY.retire(self)
        else:
            self._arm(left)

    def _matching(self, sub: Subscription) -> Dict[str, Pod]:
        names: Iterable[str] = self._pods if sub.index is None else self._by_label.get(sub.index, ())
        return {n: self._pods[n] for n in names if matches(sub.requirements, pod_labels(self._pods[n]))}

    @property
    def subscribers(self) -> int:
        """How many subscriptions are open."""
        with self.lock:
            return len(self._subs)

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        """Start listing and watching in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop at once: the open watch is shut down, the thread ends and closes the client."""
        self._stopping.set()
        with self.lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # noqa: BLE001 - already closed
                pass

    @property
    def alive(self) -> bool:
        """True while the background thread runs."""
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the thread to end."""
        self._thread.join(timeout)

    def _run(self) -> None:
        pauses = OUTAGE_BACKOFF.intervals()
        relist = True
        try:
            while not self._stopping.is_set():
                try:
                    if relist:
                        self._list()
                        relist = False
                    self._watch()
                    pauses = OUTAGE_BACKOFF.intervals()
                except WatchExpired:
                    relist = True
                except (TransientError, UnauthorizedError) as exc:
                    if isinstance(exc, UnauthorizedError) and not (self.api.outage.down and self.api.outage.served):
                        self._fail(exc)
                        break
                    # A dropped stream resumes from the last version seen; an outage is ridden out,
                    # but not for nobody: an idle informer ends here (one kept for its linger goes on,
                    # so a service's next poll still finds it warm).
                    self.last_error = exc
                    if not self._wanted():
                        break
                    self._stopping.wait(next(pauses))
                except ScalingError as exc:
                    self._fail(exc)
                    break
        except Exception as exc:  # noqa: BLE001 - any other failure ends the waits with a typed error
            self._fail(BackendUnavailableError(
                f"{self.resource.plural} informer of namespace {self.namespace!r} failed: {exc!r}"
            ))
        finally:
            self._stopping.set()
            _REGISTRY.retire(self, force=True)
            self._response = None
            self.api.close()

    def _wanted(self) -> bool:
        """Whether someone reads from this informer now or asked to keep it (its linger not yet over)."""
        with self.lock:
            return bool(self._subs) or (self._idle_until is not None and time.monotonic() < self._idle_until)

    def _fail(self, error: ScalingError) -> None:
        with self.lock:
            self.error = error
            subs = list(self._subs)
            for sub in subs:
                sub.error = error
        for sub in subs:
            sub._wake()

    def _list(self) -> None:
        # One attempt: :meth:`_run` is the informer's one retry loop, and notices a stop within a pause.
        items, version = self.api.list_objects(self.resource, self.namespace, rule=ONCE)
        self.lists += 1
        pods = {p["metadata"]["name"]: trim(self.resource, p) for p in items}
        by_label: Dict[Tuple[str, str], Set[str]] = {}
        for name, pod in pods.items():
            for pair in pod_labels(pod).items():
                by_label.setdefault(pair, set()).add(name)
        with self.lock:
            self._pods, self._by_label, self._version = pods, by_label, version
            self._floors = _ahead(self._floors, pods, version)
            first = not self.synced.is_set()
            self.synced.set()
            subs = [sub for sub in self._subs if not sub.passive]
            named = [sub for group in self._named.values() for sub in group]
            for sub in subs:
                if first:
                    # Subscribed before the cache existed: index them by what is selective now.
                    self._unindex(sub)
                    self._index(sub)
                sub.pods = self._matching(sub)
                sub.relisted = not first
        self.last_error = None
        for sub in subs + named:
            sub._wake()

    def _opened(self, response: Any) -> None:
        self._response = response
        if self._stopping.is_set():
            response.shutdown()

    def _events(self) -> Iterator[Dict[str, Any]]:
        return self.api.watch(
            self.resource, self.namespace, self._version, WATCH_WINDOW, on_open=self._opened, stopped=self._stopping.is_set
        )

    def _watch(self) -> None:
        try:
            for event in self._events():
                self._apply(event)
                if self._stopping.is_set():
                    return
        finally:
            self._response = None

    def _apply(self, event: Dict[str, Any]) -> None:
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        kind = event.get("type")
        if kind != "BOOKMARK" and meta.get("name"):
            obj = trim(self.resource, obj)
        woken: List[Subscription] = []
        with self.lock:
            if meta.get("resourceVersion"):
                self._version = str(meta["resourceVersion"])
            if kind == "BOOKMARK" or not meta.get("name"):
                return
            name = meta["name"]
            old = self._pods.get(name)
            old_labels = pod_labels(old) if old is not None else {}
            new_labels = pod_labels(obj)
            for pair in old_labels.items():
                names = self._by_label.get(pair)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self._by_label[pair]
            if kind == "DELETED":
                self._pods.pop(name, None)
                self._floors.pop(name, None)
            else:
                self._pods[name] = obj
                if name in self._floors and self._reached(name, self._floors[name]):
                    del self._floors[name]
                for pair in new_labels.items():
                    self._by_label.setdefault(pair, set()).add(name)
            woken.extend(self._named.get(name, ()))
            candidates = set(self._unindexed)
            for pair in list(old_labels.items()) + list(new_labels.items()):
                candidates.update(self._by_index.get(pair, ()))
            for sub in candidates:
                if kind != "DELETED" and matches(sub.requirements, new_labels):
                    sub.pods[name] = obj
                elif sub.pods.pop(name, None) is None:
                    continue
                woken.append(sub)
        for sub in woken:
            sub._wake()


def _credentials_fingerprint(configuration: Any) -> str:
    """A digest of who the client authenticates as (informers are shared only by the same identity); a token
    read from its file before each request counts as that file, so its rotation keeps the informers."""
    hook = configuration.refresh_api_key_hook
    token = hook.path if isinstance(hook, BearerFromFile) else sorted((configuration.api_key or {}).items())
    parts = [
        repr(token),
        repr(sorted((configuration.api_key_prefix or {}).items())),
        str(configuration.cert_file), str(configuration.key_file), str(configuration.username),
        str(configuration.password), str(configuration.ssl_ca_cert), str(configuration.verify_ssl),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _key(api: KubeApi, namespace: str, resource: Resource) -> Key:
    configuration = api.api_client.configuration
    return (str(configuration.host), _credentials_fingerprint(configuration), namespace, resource)


class _Registry:
    """The process's informers, by (API server, credentials digest, namespace, resource)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._informers: Dict[Key, Informer] = {}
        self._refused: Dict[Key, float] = {}
        """Cluster-object informers refused (RBAC, resource not served): until when reads skip them."""

    def _running(self, api: KubeApi, namespace: str, resource: Resource) -> Optional[Informer]:
        # Under the lock: the informer of the key, started if none runs (None while it was refused).
        key = _key(api, namespace, resource)
        if self._refused.get(key, 0.0) > time.monotonic():
            return None
        informer = self._informers.get(key)
        if informer is None or informer._stopping.is_set():
            informer = Informer(key, _own_api(api), namespace, resource)
            self._informers[key] = informer
            at_exit_once(_stop_informers)
            informer.start()
        return informer

    def subscribe(
        self, api: KubeApi, namespace: str, selector: str, changed: Optional[threading.Event] = None
    ) -> Subscription:
        """Subscribe to the pods matching ``selector`` in ``namespace`` on ``api``'s server (starting the
        shared informer if none runs); ``changed``, if given, is set on each change. Close the
        subscription when done."""
        with self._lock:
            informer = self._running(api, namespace, PODS)
            assert informer is not None  # pod informers are never skipped: their errors end the waits
            return informer.subscribe(selector, changed)

    def hold(
        self, api: KubeApi, namespace: str, resource: Resource, name: Optional[str] = None,
        changed: Optional[threading.Event] = None,
    ) -> Optional[Subscription]:
        """Keep the shared informer of ``resource`` in ``namespace`` running (started if needed) until the
        returned subscription is closed, so reads by name (:func:`cached_object`) can be answered from it;
        None while a refusal keeps that informer off. ``changed`` is set when object ``name`` changes or
        goes (a wait on pods is woken by its cluster object too)."""
        with self._lock:
            informer = self._running(api, namespace, resource)
            return informer.hold(name, changed) if informer is not None else None

    def retire(self, informer: Informer, force: bool = False) -> None:
        """Forget ``informer`` and stop it (unless someone subscribed meanwhile and not ``force``);
        a later subscriber starts a new one. A cluster-object informer that failed with a refusal is
        not started again for :data:`REFUSED_RETRY` seconds."""
        with self._lock:
            if informer.subscribers and not force:
                return
            if self._informers.get(informer.key) is informer:
                del self._informers[informer.key]
            if not informer.resource.is_pods and informer.error is not None:
                self._refused[informer.key] = time.monotonic() + REFUSED_RETRY
                logger.warning(
                    "%s of namespace %r are read from the API server on every poll for %.0f s: their watch was "
                    "refused (%s)", informer.resource.plural, informer.namespace, REFUSED_RETRY, informer.error,
                )
        informer.stop()

    def find(self, api: KubeApi, namespace: str, resource: Resource = PODS) -> Optional[Informer]:
        """The informer serving ``resource`` of ``namespace`` on ``api``'s server, if one runs."""
        with self._lock:
            return self._informers.get(_key(api, namespace, resource))

    def running(self) -> List[Informer]:
        """The informers serving subscribers now."""
        with self._lock:
            return list(self._informers.values())

    def stop_all(self, join_timeout: float) -> None:
        """Stop every informer and wait up to ``join_timeout`` seconds for each thread to end."""
        with self._lock:
            informers, self._informers = list(self._informers.values()), {}
        for informer in informers:
            informer.stop()
        for informer in informers:
            informer.join(join_timeout)


def _own_api(api: KubeApi) -> KubeApi:
    """A KubeApi on a client of its own (same server and credentials), so the informer outlives ``api``'s owner."""
    from kubernetes import client

    return KubeApi(client.ApiClient(copy.deepcopy(api.api_client.configuration)), api.request_timeout)


_REGISTRY = _Registry()
subscribe = _REGISTRY.subscribe
hold = _REGISTRY.hold
_Read = TypeVar("_Read")
"""What a read of the shared cache returns (:func:`_from_cache`)."""


def _stop_informers() -> None:
    """Informer threads end before the interpreter finalizes: a watch thread woken during finalization
    aborted ``ddlscale restore`` with SIGABRT (about 1 run in 12 on a loaded machine)."""
    _REGISTRY.stop_all(join_timeout=2.0)


def cached_pods(
    api: KubeApi, namespace: str, selector: str, linger: float, timeout: float, start: bool = True
) -> Optional[List[Pod]]:
    """The pods matching ``selector`` from the shared cache, or None when there is no synced cache to read.

    With ``linger`` > 0 (a long-lived caller that reads again soon) the informer is kept for ``linger``
    seconds after, and (with ``start``) started if needed and awaited for at most ``timeout`` seconds."""
    if linger <= 0 or not start:
        running = _REGISTRY.find(api, namespace)
        if running is None or not running.synced.is_set():
            return None
    sub = _REGISTRY.subscribe(api, namespace, selector)
    try:
        if not sub.wait_synced(timeout if linger > 0 else 0.0):
            return None
        if sub.error is not None:
            raise sub.error
        return list(sub.snapshot().values())
    finally:
        sub.close(linger)


def cache_lacks(api: KubeApi, namespace: str, resource: Resource, name: str) -> bool:
    """Whether the running, synced shared cache of ``resource`` holds no object ``name`` (the caller
    asks the server whether it is gone)."""
    running = _REGISTRY.find(api, namespace, resource)
    return running is not None and running.lacks(name)


def cached_object(
    api: KubeApi, namespace: str, resource: Resource, name: str, linger: float, start: bool = True
) -> Optional[Dict[str, Any]]:
    """Object ``name`` from the shared cache (its trimmed copy: read it, never patch from it), or None
    when the cache cannot answer (see :meth:`Informer.fresh`): the caller reads the server then, and
    says what it read (:func:`note_version`).

    With ``linger`` > 0 (a long-lived caller that reads again soon) the informer is kept ``linger`` seconds
    after, and (with ``start``) started if needed (never awaited: its first list answers later reads)."""
    return _from_cache(api, namespace, resource, linger, lambda informer: informer.fresh(name), start)


def cached_objects(
    api: KubeApi, namespace: str, resource: Resource, linger: float, start: bool = True
) -> Optional[List[Dict[str, Any]]]:
    """Every object of ``resource`` in ``namespace`` from the shared cache (trimmed copies), or None when
    the cache cannot answer for all of them (see :meth:`Informer.fresh_all`): the caller lists them from
    the server then, noting what it read (:func:`note_version`). ``linger`` and ``start`` as
    :func:`cached_object` takes them."""
    return _from_cache(api, namespace, resource, linger, Informer.fresh_all, start)


def _from_cache(
    api: KubeApi, namespace: str, resource: Resource, linger: float, read: Callable[["Informer"], Optional[_Read]],
    start: bool = True,
) -> Optional[_Read]:
    """``read`` of the shared informer of ``resource`` in ``namespace``: the running one only (``linger``
    <= 0, or not ``start``), held ``linger`` seconds after (started if needed with ``start``); None where
    there is none."""
    if linger <= 0 or not start:
        running = _REGISTRY.find(api, namespace, resource)
        if running is None or linger <= 0:
            return read(running) if running is not None else None
    sub = _REGISTRY.hold(api, namespace, resource)
    if sub is None:
        return None
    try:
        return read(sub.informer)
    finally:
        sub.close(linger)


def note_version(api: KubeApi, namespace: str, resource: Resource, name: str, obj: Dict[str, Any]) -> str:
    """This process wrote ``obj`` (a patch's answer) or read it from the server: the shared cache, if
    one runs, answers for it only from that version on. Returns the version ('' where ``obj`` has none)."""
    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    if version:
        expect_version(api, namespace, resource, name, version)
    return version


def expect_version(api: KubeApi, namespace: str, resource: Resource, name: str, version: str) -> None:
    """Object ``name`` is at ``version`` or later on the server (this process, or another one that said
    so, wrote or read it there): the shared cache, if one runs, answers for it only from then on. An
    informer started later needs no such note: its first list is read from the server after the write."""
    running = _REGISTRY.find(api, namespace, resource)
    if running is not None:
        running.note(name, version)


def running_informers(resource: Optional[Resource] = PODS) -> List[Informer]:
    """The informers of this process of ``resource`` (None: every resource), for tests and benchmarks."""
    return [i for i in _REGISTRY.running() if resource is None or i.resource == resource]


class VersionsSeen:
    """Per object (namespace, plural, name), the newest resourceVersion this process wrote or read, for
    another process (a connector replica hands it to the one answering the node's next poll, which then
    trusts its cache only from there: :func:`expect_version`); thread-safe, the newest :data:`KEPT` objects."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: "OrderedDict[Tuple[str, str, str], str]" = OrderedDict()

    def saw(self, key: Tuple[str, str, str], version: str) -> None:
        """The object ``key`` was written or read at ``version`` ('' is ignored)."""
        if not version:
            return
        with self._lock:
            known = self._versions.pop(key, "")
            self._versions[key] = known if known and at_least(known, version) else version
            while len(self._versions) > KEPT:
                self._versions.popitem(last=False)

    def newest(self, key: Tuple[str, str, str]) -> str:
        """The newest version of ``key`` written or read, '' where none is kept."""
        with self._lock:
            return self._versions.get(key, "")
