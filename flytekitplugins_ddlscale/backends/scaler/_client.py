"""HTTP client of Domino's cluster scaler service: one pooled ``httpx.Client``.

Reads and scale (an absolute count) are safe to repeat and retried; a head
restart deletes a pod and is never re-sent. Every request goes through the one
retry loop, :func:`~flytekitplugins_ddlscale._core.outage.send`; the polls of
waits through the shared, paced polls (:mod:`.polls`). Error answers become
the plugin's typed errors (:func:`error_from_response`).
"""
import dataclasses
import hashlib
import ipaddress
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Set

import httpx

from .._support.crds import layout_of
from .._support.domino_auth import DominoAuth
from ..._core import settings
from ...errors import (
    BackendUnavailableError, CertificateRefusedError, ClusterNotFoundError, InvalidInputError, NotScalableError,
    ScalingError, UnauthorizedError, UnknownTierError, UnsupportedOperationError,
)
from ..._core.redaction import register_secret
from ...refs import ClusterRef
from ..._core.outage import RetryRule, attempt_timeout, cert_verification_failed, nothing_sent, send, shared_tracker
from ..._core.validation import validate_timeout
from ..._core.waiting import Backoff, Deadline, PollSchedule, TwoStageBackoff
from ._polls import LIST_FROM, max_rps_from, pacer_for, polls_for

logger = logging.getLogger("flytekitplugins_ddlscale.scaler")

BASE_URL_ENV = settings.CLUSTER_SCALER_BASE_URL.name
DEFAULT_BASE_URL = settings.CLUSTER_SCALER_BASE_URL.default
API_PREFIX = "/ddl_cluster_scaler"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers of a service that is overloaded or restarting (a 500 is the service's own error, e.g. a
missing cluster, and is final)."""
REFUSED_STATUSES = frozenset({401, 403})
"""Refusals: final, except right after an outage (see :func:`~flytekitplugins_ddlscale._core.outage.send`)."""
DEFAULT_HTTP_TIMEOUT = 30.0
DEFAULT_RETRIES = 3
DEFAULT_RETRY_BACKOFF = RetryRule().backoff
DEFAULT_POLL_BACKOFF = TwoStageBackoff(slow=3.0)
"""Poll intervals of scale waits: 0.25 s doubling to 1 s for the first 10 s, then 3 s
(the reference client polls every 2 s: fewer requests over a long wait, less lag on a short one)."""
DEFAULT_RESTART_POLL_BACKOFF = TwoStageBackoff(slow=10.0)
"""Poll intervals of head-restart waits: as for scale, then 10 s (the reference polls every 3 s)."""
SLOWING_STATUSES = frozenset({429, 503})
"""Answers that slow every poll of this process to the service down (see :mod:`.polls`)."""
SERVED_PLURALS = "rayclusters, sparkclusters, daskclusters"
_K8S_NOT_FOUND = re.compile(r"^\(404\)|\"reason\":\s*\"NotFound\"|\"code\":\s*404")
"""A Kubernetes 404 in a 500's ``details``: the only way the service says a cluster does not exist."""


def resolve_base_url(base_url: Optional[str], env: Optional[Mapping[str, str]] = None) -> str:
    """``base_url``, else ``$CLUSTER_SCALER_BASE_URL``, else the in-cluster default; no trailing slash."""
    return settings.CLUSTER_SCALER_BASE_URL.value(base_url or None, env, field="base_url")


def displayable_url(url: str) -> str:
    """``url`` without its userinfo (``user:password@``), for messages and logs."""
    parsed = httpx.URL(url)
    if not parsed.userinfo:
        return url
    return str(parsed.copy_with(username=None, password=None)).rstrip("/")


def credentials_in_clear(url: str) -> bool:
    """Whether credentials sent to ``url`` would cross the network unencrypted: plain ``http://`` to a
    host that is not loopback (``localhost``, 127.0.0.0/8, ::1)."""
    parsed = httpx.URL(url)
    if parsed.scheme != "http":
        return False
    host = parsed.host.lower()
    if host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


_warned_clear: Set[str] = set()
_warned_lock = threading.Lock()


def _warn_clear_once(url: str, auth: Optional[httpx.Auth]) -> None:
    """Log once per process and URL that this client's credentials travel over plain HTTP."""
    sends = auth is not None and not (isinstance(auth, DominoAuth) and auth.source == "none")
    if not sends or not credentials_in_clear(url):
        return
    with _warned_lock:
        if url in _warned_clear:
            return
        _warned_clear.add(url)
    logger.warning(
        "the scaler service at %s is plain HTTP: the Domino token or API key sent with every request is not "
        "encrypted on the way; that is acceptable only inside the cluster network (the in-cluster default "
        "service URL), else set $%s to an https:// URL", url, BASE_URL_ENV,
    )


@dataclass(frozen=True)
class Sending:
    """How one request is sent: ``retry`` when it is safe to repeat, ``ride_out`` for a read inside a wait
    (an outage is ridden out until its deadline), ``paced`` for a poll (each attempt waits for its slot)."""

    retry: bool
    ride_out: bool = False
    paced: bool = False


ONCE = Sending(retry=False)
"""A request never re-sent (a head restart deletes a pod)."""
REPEATABLE = Sending(retry=True)
READ = Sending(retry=True, ride_out=True)
POLL = Sending(retry=True, ride_out=True, paced=True)


@dataclass(frozen=True)
class ScalerOptions:
    """How this process talks to the scaler service, given as ``options=`` to :class:`ScalerServiceBackend`
    or :class:`ScalerClient`; checked when made (:class:`InvalidInputError` naming the field)."""

    verify: bool = True
    """Verify the service's TLS certificate."""
    timeout: float = DEFAULT_HTTP_TIMEOUT
    """Seconds each HTTP call may take."""
    retries: int = DEFAULT_RETRIES
    """Repeats (0 to 10) of a request safe to repeat, spaced by ``retry_backoff``."""
    retry_backoff: Backoff = DEFAULT_RETRY_BACKOFF
    poll_backoff: PollSchedule = DEFAULT_POLL_BACKOFF
    """Spacing of the polls of scale waits."""
    restart_poll_backoff: Optional[PollSchedule] = None
    """Spacing of the polls of head-restart waits (None: the default, or ``poll_backoff`` when one is given)."""
    max_requests_per_second: Optional[float] = None
    """This process's pace of polls to the service (None: ``$DDLSCALE_SCALER_MAX_RPS`` or its default)."""
    sleep: Callable[[float], None] = time.sleep
    """How a pause is slept."""

    def __post_init__(self) -> None:
        validate_timeout(self.timeout)
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= 10:
            raise InvalidInputError("retries", self.retries, "an integer from 0 to 10")

    @property
    def restart_polls(self) -> PollSchedule:
        """The spacing of head-restart polls this value says."""
        if self.restart_poll_backoff is not None:
            return self.restart_poll_backoff
        return DEFAULT_RESTART_POLL_BACKOFF if self.poll_backoff is DEFAULT_POLL_BACKOFF else self.poll_backoff


class ScalerClient:
    """The service's routes as methods returning parsed JSON, raising typed errors."""

    def __init__(
        self, base_url: Optional[str] = None, *, auth: Optional[httpx.Auth] = None,
        env: Optional[Mapping[str, str]] = None, options: ScalerOptions = ScalerOptions(),
    ) -> None:
        rate = max_rps_from(options.max_requests_per_second, None if env is None else dict(env))
        url = resolve_base_url(base_url, env)
        parsed = httpx.URL(url)
        if parsed.password:
            # Both spellings: decoded (what httpx sends) and as written (percent-encoded).
            register_secret(parsed.password)
            register_secret(parsed.userinfo.decode("ascii").partition(":")[2])
        self.base_url = displayable_url(url)
        """The service URL without any userinfo, safe to show."""
        self.timeout = options.timeout
        self.outage = shared_tracker(f"the scaler service at {self.base_url}", logger)
        """Reachability of the service, shared by every client of it in this process."""
        self._rule = RetryRule(attempts=1 + options.retries, backoff=options.retry_backoff)
        self._sleep = options.sleep
        auth = auth if auth is not None else DominoAuth(env=env, verify=options.verify)
        _warn_clear_once(self.base_url, auth)
        self._http = httpx.Client(
            base_url=url, auth=auth, timeout=httpx.Timeout(options.timeout), verify=options.verify,
            headers={"Accept": "application/json"},
        )
        self.pacer = pacer_for(self.base_url, rate)
        """This process's pacing of polls to the service."""
        self.polls = polls_for(self.base_url, _identity(self._http.auth))
        """This process's polls of the service shared between waits with the same credentials."""

    @property
    def auth(self) -> Optional[httpx.Auth]:
        """The credentials this client sends (reused for Nucleus calls)."""
        return self._http.auth

    def close(self) -> None:
        """Close pooled connections."""
        self._http.close()

    def _send(
        self, ref: ClusterRef, method: str, path: str, how: Sending, deadline: Optional[Deadline] = None,
        **kwargs: Any,
    ) -> httpx.Response:
        # The service's answer, sent as ``how`` says through the one retry path (:func:`outage.send`).
        sent = 0

        def attempt() -> httpx.Response:
            nonlocal sent
            pause = self.pacer.slot(deadline) if how.paced else 0.0
            while pause > 0:
                self._sleep(pause)
                pause = self.pacer.held(deadline)
            kwargs["timeout"] = attempt_timeout(self.timeout, deadline)
            sent += 1
            response = self._http.request(method, path, **kwargs)
            if response.status_code in SLOWING_STATUSES:
                self.pacer.slowed(_retry_after(response))
            else:
                self.pacer.answered()
            if response.status_code in REFUSED_STATUSES or (how.retry and response.status_code in RETRY_STATUSES):
                raise httpx.HTTPStatusError(f"HTTP {response.status_code}", request=response.request, response=response)
            return response

        try:
            rule = dataclasses.replace(self._rule, ride_out=how.ride_out) if how.retry else RetryRule()
            return send(attempt, tracker=self.outage, rule=rule, deadline=deadline, what=f"{method} {path}",
                        sleep=self._sleep)
        except httpx.HTTPStatusError as answer:
            return answer.response
        except httpx.TransportError as exc:
            failed = exc
        # Raised outside the handler, so the error does not carry the request (and its URL) as context.
        raise self._unavailable(failed, ref, method, path, retry=how.retry, sent=sent)

    def _unavailable(
        self, exc: httpx.TransportError, ref: ClusterRef, method: str, path: str, *, retry: bool, sent: int
    ) -> Exception:
        """The typed error of a request whose last attempt failed on the wire."""
        where, name = f"{method} {self.base_url}{path}", type(exc).__name__
        described = f"{name}: {exc}" if str(exc) else name
        if cert_verification_failed(exc):
            return CertificateRefusedError(
                f"{where}: the service's TLS certificate was refused ({described}); nothing was sent", cluster=str(ref)
            )
        if retry:
            message = f"{where} failed {sent} times; last: {name}"
        elif nothing_sent(exc):
            message = f"{where}: could not connect ({described}); nothing was sent"
        else:
            message = (f"{method} {path}: {name}; not retried because the operation is not safe to repeat, "
                       "so it may or may not have happened")
        return BackendUnavailableError(message, cluster=str(ref))

    def get_cluster(
        self, ref: ClusterRef, deadline: Optional[Deadline] = None, *, paced: bool = False
    ) -> Dict[str, Any]:
        """The cluster's whole custom object. With ``deadline``, an outage is ridden out until it passes;
        without, the client's bounded retries apply. ``paced``: a poll, sent in its slot."""
        response = self._send(
            ref, "GET", f"{API_PREFIX}/cluster/{ref.plural}/{ref.name}", POLL if paced else READ, deadline
        )
        if response.status_code != 200:
            raise error_from_response(response, ref, operation="get cluster")
        return response_body(response)

    def poll_cluster(
        self, ref: ClusterRef, deadline: Optional[Deadline], max_age: float, not_before: Optional[float] = None
    ) -> Dict[str, Any]:
        """:meth:`get_cluster` as a shared, paced poll: another wait's read of the cluster (or list of its
        kind, from :data:`~._polls.LIST_FROM` waited on) in flight or at most ``max_age`` seconds old, and
        begun at ``not_before`` (epoch seconds) or later, answers it. One the list lacks is read alone."""
        if self.shared_by_list(ref):
            listed = self.polls.read(
                f"list:{ref.plural}", lambda: self._list(ref, deadline), max_age, deadline, not_before
            )
            if ref.name in listed:
                return listed[ref.name]
        return self.polls.read(
            f"{ref.plural}/{ref.name}", lambda: self.get_cluster(ref, deadline, paced=True), max_age, deadline,
            not_before,
        )

    def cached_cluster(
        self, ref: ClusterRef, max_age: float, not_before: Optional[float] = None
    ) -> Optional[Dict[str, Any]]:
        """:meth:`poll_cluster`'s answer where a shared read it would reuse holds it (nothing sent, no
        wait), else None."""
        if self.shared_by_list(ref):
            listed = self.polls.cached(f"list:{ref.plural}", max_age, not_before)
            if listed is not None and ref.name in listed:
                return listed[ref.name]
        return self.polls.cached(f"{ref.plural}/{ref.name}", max_age, not_before)

    def shared_by_list(self, ref: ClusterRef) -> bool:
        """Whether polls of ``ref`` are answered by one list of its kind (enough clusters waited on)."""
        return self.polls.crowd(ref.plural, ref.name) >= LIST_FROM

    def _list(self, ref: ClusterRef, deadline: Optional[Deadline]) -> Dict[str, Dict[str, Any]]:
        response = self._send(ref, "GET", f"{API_PREFIX}/list/{ref.plural}", POLL, deadline)
        if response.status_code != 200:
            raise error_from_response(response, ref, operation="list clusters")
        clusters = response_body(response).get("clusters") or []
        return {str((c.get("metadata") or {}).get("name")): c for c in clusters if isinstance(c, dict)}

    def _forget(self, ref: ClusterRef) -> None:
        self.polls.forget(f"{ref.plural}/{ref.name}", f"list:{ref.plural}")

    def scale(
        self, ref: ClusterRef, replicas: int, worker_hw_tier: Optional[str], deadline: Optional[Deadline] = None
    ) -> Dict[str, Any]:
        """PATCH the worker count (and tier, as ``worker_hw_tier_name``); the service's answer. Retried (an
        absolute count is safe to repeat); with ``deadline``, a refused connection is tried until it passes."""
        body: Dict[str, Any] = {"replicas": replicas}
        if worker_hw_tier is not None:
            body["worker_hw_tier_name"] = worker_hw_tier
        try:
            response = self._send(
                ref, "PATCH", f"{API_PREFIX}/scale/{ref.plural}/{ref.name}", REPEATABLE, deadline, json=body
            )
        finally:
            # Whatever the answer, a read from before this request must not answer a wait after it.
            self._forget(ref)
        if response.status_code != 200:
            raise error_from_response(response, ref, operation="scale", bad_request_value=replicas)
        return response_body(response)

    def restart_head(self, ref: ClusterRef, deadline: Optional[Deadline] = None) -> Dict[str, Any]:
        """Ask the service to delete the head pod, never re-sent; its 202 answer with ``pod`` and
        ``started_at``. The service deletes ``<name>-<kind>-head-0``, right only for Ray: for Spark and
        Dask its 404 naming that pod raises :class:`UnsupportedOperationError`."""
        try:
            response = self._send(
                ref, "PATCH", f"{API_PREFIX}/restart_head/{ref.plural}/{ref.name}", ONCE, deadline
            )
        finally:
            self._forget(ref)
        if response.status_code in (200, 202):
            return response_body(response)
        if response.status_code == 404:
            pod = str(response_body(response).get("pod") or "")
            real = layout_of(ref).head_pod_name(ref.name)
            if pod and pod != real:
                raise UnsupportedOperationError(
                    f"the scaler service cannot restart {ref.kind} heads: it deletes pod {pod!r}, but the "
                    f"{ref.kind} head pod is {real!r} (a known defect of the service; it only works for Ray). "
                    f"Use the kubernetes backend (DDLSCALE_BACKEND=kubernetes) to restart this head",
                    status_code=404, cluster=str(ref),
                )
            raise ClusterNotFoundError(
                f"restart head failed: head pod {pod or real!r} does not exist", status_code=404, cluster=str(ref)
            )
        raise error_from_response(response, ref, operation="restart head")

    def restart_status(
        self, ref: ClusterRef, started_at: str, deadline: Optional[Deadline] = None
    ) -> Optional[Dict[str, Any]]:
        """The head's restart status since ``started_at`` (the service's value); None while the pod
        is being recreated. With ``deadline``, outages are ridden out until it passes."""
        path = f"{API_PREFIX}/restart_head_status/{ref.plural}/{ref.name}"
        response = self._send(ref, "GET", path, POLL, deadline, params={"started_at": started_at})
        if response.status_code == 200:
            return response_body(response)
        if response.status_code == 404:
            return None
        raise error_from_response(
            response, ref, operation="restart head status", bad_request_field="started_at", bad_request_value=started_at
        )


def _identity(auth: Any) -> str:
    """A digest of the credentials ``auth`` sends (polls are shared only between the same identity)."""
    if isinstance(auth, DominoAuth):
        secret = "\0".join(str(v) for v in (auth.api_proxy, auth.token, auth.api_key))
        return hashlib.sha256(secret.encode()).hexdigest()
    return f"object-{id(auth)}"


def _retry_after(response: httpx.Response) -> Optional[float]:
    """The seconds of a ``Retry-After`` header given in seconds, else None."""
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None


def response_body(response: httpx.Response) -> Dict[str, Any]:
    """The JSON object of ``response``, or ``{}`` when it is not a JSON object."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def error_from_response(
    response: httpx.Response, ref: ClusterRef, *, operation: str, bad_request_field: str = "replicas",
    bad_request_value: Optional[object] = None,
) -> ScalingError:
    """The typed error for a non-success answer to ``operation`` on ``ref``."""
    status = response.status_code
    body = response_body(response)
    code = str(body.get("error") or body.get("status") or f"http_{status}")
    said = body.get("message") or body.get("error") or response.reason_phrase
    where = str(ref)
    text = f"{operation} failed: {said}"
    if status == 400 and code == "invalid_kind":
        return InvalidInputError("kind", ref.plural, SERVED_PLURALS)
    if status == 400 and code == "invalid_hw_tier":
        return UnknownTierError(text, code=code, status_code=status, cluster=where)
    if status == 400:
        return InvalidInputError(bad_request_field, bad_request_value, f"what the service accepts ({said})")
    if status in (401, 403):
        return UnauthorizedError(
            f"{text}; the caller must be a Domino admin or the cluster's owner", code=code, status_code=status,
            cluster=where,
        )
    if status == 409:
        return NotScalableError(text, code=code, status_code=status, cluster=where)
    if status == 404 or (status == 500 and _K8S_NOT_FOUND.search(str(body.get("details") or ""))):
        return ClusterNotFoundError(
            f"{operation} failed: {ref.plural}/{ref.name} does not exist in the service's namespace",
            code="not_found", status_code=status, cluster=where,
        )
    if status in (502, 503, 504):
        return BackendUnavailableError(text, code=code, status_code=status, cluster=where)
    return ScalingError(text, code=code, status_code=status, cluster=where)
