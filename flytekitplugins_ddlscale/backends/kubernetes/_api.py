"""The few Kubernetes API calls the backend makes, with errors made typed.

Wraps the official client's ``CustomObjectsApi`` and ``CoreV1Api``: cluster
objects are read and merge-patched (always ``application/merge-patch+json``:
custom resources refuse strategic merge with 415), pods are listed, watched
and deleted. API errors become :mod:`flytekitplugins_ddlscale.errors` types
naming the verb and resource. Without a deadline, reads are retried a
bounded number of times on connection errors, 429 and 5xx. Calls made under
an operation's :class:`~flytekitplugins_ddlscale._core.waiting.Deadline` give each
attempt at most the time left; reads then ride out an outage until the
deadline, while writes are tried again only when nothing was sent (the caller
decides about the rest, since only it knows whether a write is safe to
repeat): the one retry path of :func:`flytekitplugins_ddlscale._core.outage.send`.
"""
import json
import logging
import math
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ...errors import (
    BackendUnavailableError,
    CertificateRefusedError,
    ClusterNotFoundError,
    ConflictError,
    NotScalableError,
    ScalingError,
    TransientError,
    UnauthorizedError,
)
from ..._core.outage import RetryRule, attempt_timeout, cert_verification_failed, send, shared_tracker
from ..._core.redaction import redact
from ..._core.sharing import refuse_in_cache_only
from .._support.crds import CRD_GROUP, CRD_VERSION
from ..._core.waiting import Deadline
from ._client import limit_retries

MERGE_PATCH = "application/merge-patch+json"
READ_RETRIES = RetryRule(attempts=3)
"""The bounded retries of a read without a deadline: 3 attempts, 0.2 s then 0.4 s apart."""
logger = logging.getLogger("flytekitplugins_ddlscale.kubernetes")


class Conflict(ConflictError):
    """HTTP 409 from a resourceVersion or uid precondition; callers re-read and re-apply."""


class WatchExpired(TransientError):
    """HTTP 410 Gone: the watch's resourceVersion is too old; re-list (the informer does, at once)."""

    code = "watch_expired"


def _status_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "reason", "") or exc)


def translate(exc: Exception, verb: str, resource: str, name: Optional[str], namespace: str) -> ScalingError:
    """The typed error for an API exception from ``verb`` on ``resource`` (a typed error as it is)."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ScalingError):
        return exc
    target = f"{resource} {name!r}" if name else resource
    where = f"{target} in namespace {namespace!r}"
    if cert_verification_failed(exc):
        return CertificateRefusedError(
            f"{verb} {where}: the API server's TLS certificate was refused ({type(exc).__name__}: {redact(exc)}); "
            "nothing was sent (check the kubeconfig's certificate-authority and server address)"
        )
    if not isinstance(exc, ApiException):
        return BackendUnavailableError(f"{verb} {where} failed: {type(exc).__name__}: {redact(exc)}")
    status = exc.status or 0
    message = _status_message(exc)
    if status in (401, 403):
        return UnauthorizedError(
            f"Kubernetes refused to {verb} {where} (RBAC): {message}. "
            f"Grant the '{verb}' verb on '{resource}' (see the Role for the cluster's kind in examples/k8s/: "
            "rbac.yaml, kuberay-rbac.yaml, dask-operator-rbac.yaml)",
            status_code=status,
        )
    if status == 404:
        return ClusterNotFoundError(f"{where} not found: {message}", status_code=status)
    if status == 409:
        return Conflict(f"{verb} {where} conflicted: {message}", status_code=status)
    if status == 410:
        return WatchExpired(f"{verb} {where}: {message}", status_code=status)
    if status in (400, 415, 422):
        return NotScalableError(f"Kubernetes rejected {verb} {where}: {message}", status_code=status)
    return BackendUnavailableError(f"{verb} {where} failed: HTTP {status}: {message}", status_code=status)


class KubeApi:
    """Cluster objects and pods in one namespace-agnostic client.

    ``api_client``'s urllib3 retries are limited (see
    :func:`~flytekitplugins_ddlscale.backends.kubernetes._client.limited_retries`)
    so that no request outlives the timeout it was given.
    """

    def __init__(self, api_client: Any, request_timeout: float = 30.0) -> None:
        from kubernetes import client

        limit_retries(api_client)
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.request_timeout = request_timeout
        host = getattr(api_client.configuration, "host", "") or ""
        self.outage = shared_tracker(f"the Kubernetes API server {host}".rstrip(), logger)
        """Reachability of the API server, shared by every client of it in this process (the shared
        pod informer included), so an outage is logged once."""

    def _call(
        self, verb: str, resource: str, name: Optional[str], namespace: str,
        call: Callable[[float], Any], deadline: Optional[Deadline] = None, *, read: bool = True,
    ) -> Any:
        # A read is retried by READ_RETRIES, or rides the outage out under a deadline; a write is
        # sent once (tried again under a deadline only while nothing was sent).
        refuse_in_cache_only(f"{verb} {resource}")
        try:
            return send(
                lambda: call(attempt_timeout(self.request_timeout, deadline)), tracker=self.outage,
                what=f"{verb} {resource}", rule=READ_RETRIES if read else None, deadline=deadline, ride_out=read,
            )
        except Exception as exc:  # noqa: BLE001 - translated
            raise translate(exc, verb, resource, name, namespace) from None

    def get_cluster(
        self, plural: str, namespace: str, name: str, deadline: Optional[Deadline] = None,
        group: str = CRD_GROUP, version: str = CRD_VERSION,
    ) -> Dict[str, Any]:
        """The cluster object (of ``group``/``version``, Domino's DCO by default) as a dict;
        attempts end by ``deadline`` if given."""
        return self._call(
            "get", plural, name, namespace,
            lambda timeout: self.custom.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=timeout
            ),
            deadline,
        )

    def list_clusters(
        self, plural: str, namespace: str, selector: str, group: str, version: str,
        deadline: Optional[Deadline] = None,
    ) -> List[Dict[str, Any]]:
        """Custom objects of ``plural`` matching ``selector``; attempts end by ``deadline`` if given."""
        return self._call(
            "list", plural, None, namespace,
            lambda timeout: self.custom.list_namespaced_custom_object(
                group, version, namespace, plural, label_selector=selector, _request_timeout=timeout
            ).get("items") or [],
            deadline,
        )

    def patch_cluster(
        self, plural: str, namespace: str, name: str, patch: Dict[str, Any], deadline: Optional[Deadline] = None,
        group: str = CRD_GROUP, version: str = CRD_VERSION,
    ) -> Dict[str, Any]:
        """One JSON merge patch of the cluster object (of ``group``/``version``); returns the object
        after it.

        Sent once; with ``deadline``, a connection refused before anything was
        sent is tried again until it passes."""
        return self._call(
            "patch", plural, name, namespace,
            lambda timeout: self.custom.patch_namespaced_custom_object(
                group, version, namespace, plural, name, patch, _content_type=MERGE_PATCH, _request_timeout=timeout,
            ),
            deadline, read=False,
        )

    def list_pods(
        self, namespace: str, selector: str, deadline: Optional[Deadline] = None
    ) -> Tuple[List[Dict[str, Any]], str]:
        """Pods matching ``selector`` as dicts, and the list's resourceVersion; attempts end by ``deadline``."""

        def call(timeout: float) -> Tuple[List[Dict[str, Any]], str]:
            response = self.core.list_namespaced_pod(
                namespace, label_selector=selector, _preload_content=False, _request_timeout=timeout,
            )
            data = json.loads(response.data)
            return data.get("items") or [], str(data["metadata"]["resourceVersion"])

        return self._call("list", "pods", None, namespace, call, deadline)

    def list_objects(
        self, plural: str, namespace: str, group: str, version: str, deadline: Optional[Deadline] = None
    ) -> Tuple[List[Dict[str, Any]], str]:
        """Every custom object of ``plural`` in ``namespace`` as dicts, and the list's resourceVersion
        (what a watch starts from); attempts end by ``deadline``."""

        def call(timeout: float) -> Tuple[List[Dict[str, Any]], str]:
            response = self.custom.list_namespaced_custom_object(
                group, version, namespace, plural, _preload_content=False, _request_timeout=timeout,
            )
            data = json.loads(response.data)
            return data.get("items") or [], str(data["metadata"]["resourceVersion"])

        return self._call("list", plural, None, namespace, call, deadline)

    def watch_pods(
        self, namespace: str, selector: str, resource_version: str, seconds: float,
        on_open: Optional[Callable[[Any], None]] = None,
        stopped: Optional[Callable[[], bool]] = None,
    ) -> Iterator[Dict[str, Any]]:
        """Pod events (``{"type", "object"}``) after ``resource_version`` for about ``seconds``.

        Ends normally when the server closes the window or nothing arrives for
        ``seconds`` (the server only takes whole seconds); connecting takes at
        most ``seconds`` too, so a caller bounds the watch by its time left. Raises
        :class:`WatchExpired` on 410 and :class:`BackendUnavailableError`
        when the connection breaks. ``on_open(response)`` is handed the open stream, so another
        thread can end it early (``response.shutdown()``); ``stopped()`` then says so, and the
        watch ends quietly: a stream this process ended is no sign of a restarting server.
        """
        return self._watch("pods", namespace, seconds, on_open, stopped, lambda timeouts: self.core.list_namespaced_pod(
            namespace, label_selector=selector, watch=True, resource_version=resource_version,
            timeout_seconds=max(1, math.ceil(seconds)), allow_watch_bookmarks=True, _preload_content=False,
            _request_timeout=timeouts,
        ))

    def watch_objects(
        self, plural: str, namespace: str, group: str, version: str, resource_version: str, seconds: float,
        on_open: Optional[Callable[[Any], None]] = None,
        stopped: Optional[Callable[[], bool]] = None,
    ) -> Iterator[Dict[str, Any]]:
        """Events of the custom objects of ``plural`` in ``namespace``, as :meth:`watch_pods` gives pods'."""
        return self._watch(plural, namespace, seconds, on_open, stopped, lambda timeouts: (
            self.custom.list_namespaced_custom_object(
                group, version, namespace, plural, watch=True, resource_version=resource_version,
                timeout_seconds=max(1, math.ceil(seconds)), allow_watch_bookmarks=True, _preload_content=False,
                _request_timeout=timeouts,
            )
        ))

    def _watch(
        self, resource: str, namespace: str, seconds: float, on_open: Optional[Callable[[Any], None]],
        stopped: Optional[Callable[[], bool]], open_stream: Callable[[Tuple[float, float]], Any],
    ) -> Iterator[Dict[str, Any]]:
        from kubernetes.watch.watch import iter_resp_lines
        from urllib3.exceptions import ReadTimeoutError

        try:
            # One attempt: the caller re-reads between watches, riding out an outage there.
            response = send(
                lambda: open_stream((min(self.request_timeout, max(0.05, seconds)), max(0.05, seconds))),
                tracker=self.outage, what=f"watch {resource}", rule=None,
            )
        except Exception as exc:  # noqa: BLE001 - translated
            raise translate(exc, "watch", resource, None, namespace) from None
        try:
            if on_open is not None:
                on_open(response)
            for line in iter_resp_lines(response):
                if not line:
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == 410:
                        raise WatchExpired(f"watch {resource}: {status.get('message')}", status_code=410)
                    raise BackendUnavailableError(
                        f"watch {resource} in namespace {namespace!r} failed: {status.get('message')}",
                        status_code=status.get("code"),
                    )
                yield event
        except ScalingError:
            raise
        except ReadTimeoutError:
            return
        except Exception as exc:  # noqa: BLE001 - a dropped stream is expected; the caller resumes
            if stopped is not None and stopped():
                return
            # A stream cut mid-way is how a restarting server goes away: the 401/403 of the server
            # that comes back is then ridden out, even if no connection was refused in between.
            self.outage.interrupted()
            raise BackendUnavailableError(
                f"watch of {resource} in namespace {namespace!r} broke: {type(exc).__name__}"
            ) from None
        finally:
            # Close rather than return a half-read stream to the pool.
            response.close()
            response.release_conn()

    def delete_pod(self, namespace: str, name: str, uid: str, deadline: Optional[Deadline] = None) -> Dict[str, Any]:
        """Delete pod ``name`` only if it still has ``uid`` (409 :class:`Conflict` otherwise).

        Sent once; with ``deadline``, a connection refused before anything was
        sent is tried again until it passes."""
        from kubernetes import client

        response = self._call(
            "delete", "pods", name, namespace,
            lambda timeout: self.core.delete_namespaced_pod(
                name, namespace, body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
                _preload_content=False, _request_timeout=timeout,
            ),
            deadline, read=False,
        )
        return json.loads(response.data)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close the connection pool."""
        self.api_client.close()
