"""The Kubernetes API client of the backend: the few calls it makes, with errors made typed.

Cluster objects are read and merge-patched (always ``application/merge-patch+json``: custom resources
refuse strategic merge with 415), objects and pods listed and watched, pods deleted. Each request goes
through the one retry loop, :func:`~flytekitplugins_ddlscale._core.outage.send`, as its
:class:`~flytekitplugins_ddlscale._core.outage.RetryRule` says (reads: :data:`READS`; writes: sent once,
again only while nothing was sent); each attempt gets at most the time its deadline leaves.
"""
import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..._core import settings
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
from ..._core.outage import ONCE, RetryRule, attempt_timeout, cert_verification_failed, send, shared_tracker
from ..._core.redaction import redact, register_secret
from ..._core.waiting import Deadline
from .._support.domino_auth import TokenFile

MERGE_PATCH = "application/merge-patch+json"
READS = RetryRule(attempts=3, ride_out=True)
"""A read: 3 attempts 0.2 s then 0.4 s apart without a deadline; under one, the outage ridden out."""
WRITES = RetryRule()
"""A write: sent once; under a deadline, again while nothing was sent (the caller decides the rest)."""
POOL_CONNECTIONS = 64
"""Connections kept open for reuse (at least the connector's concurrent readers): the client's
default, ``cpu_count x 5``, closes every connection past it, so each later request handshakes anew."""
logger = logging.getLogger("flytekitplugins_ddlscale.kubernetes")


@dataclass(frozen=True)
class Resource:
    """Pods, or the custom objects of ``plural`` in ``group``/``version``."""

    plural: str
    group: str = ""
    version: str = "v1"

    @property
    def is_pods(self) -> bool:
        return not self.group and self.plural == "pods"


PODS = Resource("pods")


class Conflict(ConflictError):
    """HTTP 409 from a resourceVersion or uid precondition; callers re-read and re-apply."""


class WatchExpired(TransientError):
    """HTTP 410 Gone: the watch's resourceVersion is too old; re-list (the informer does, at once)."""

    code = "watch_expired"


def make_api_client(kubeconfig: Optional[str], context: Optional[str], in_cluster: Optional[bool]) -> Any:
    """A ``kubernetes.client.ApiClient``: in a pod (``$KUBERNETES_SERVICE_HOST``) the service account's
    in-cluster config unless a kubeconfig is given, else the kubeconfig (``kubeconfig``, ``$KUBECONFIG``,
    ``~/.kube/config``) and ``context``; :data:`POOL_CONNECTIONS` kept (:class:`KubeApi` stops urllib3's retries)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    use_in_cluster = in_cluster if in_cluster is not None else (
        kubeconfig is None and settings.KUBERNETES_SERVICE_HOST.is_set()
    )
    try:
        if use_in_cluster:
            config.load_incluster_config(client_configuration=configuration)
            path = config.incluster_config.SERVICE_TOKEN_FILENAME
            token = TokenFile(path, f"the service account's token ({path})")
            configuration.refresh_api_key_hook = BearerFromFile(token)
        else:
            # Read $KUBECONFIG now: the client computes its default path once, at import.
            path = settings.KUBECONFIG.value(kubeconfig or None)
            config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        source = "in-cluster service account" if use_in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
        raise BackendUnavailableError(f"could not load Kubernetes configuration from {source}: {exc}") from None
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, POOL_CONNECTIONS)
    for value in (configuration.api_key or {}).values():
        register_secret(str(value))
        register_secret(str(value).split(" ", 1)[-1])
    return client.ApiClient(configuration)


class BearerFromFile:
    """The client's hook before each request: the token its file holds then (the kubelet rotates a service
    account's token). Copies of the client share it; shared informers key such a client by :attr:`path`."""

    def __init__(self, token: TokenFile) -> None:
        self.token, self.path = token, token.path

    def __call__(self, configuration: Any) -> None:
        configuration.api_key.update(BearerToken=f"Bearer {self.token.read()}")

    def __deepcopy__(self, memo: Dict[int, Any]) -> "BearerFromFile":
        return self


def _limit_retries(api_client: Any) -> None:
    """Give ``api_client``'s connection pools, existing ones included, urllib3's retries off (no reconnect,
    never a resend): :func:`send` retries, and urllib3's default would resend a request whose answer
    timed out, with the full timeout each time."""
    from urllib3.util.retry import Retry

    retries = Retry(total=1, connect=0, read=0, status=0, other=0)
    api_client.configuration.retries = retries
    manager = api_client.rest_client.pool_manager
    manager.connection_pool_kw["retries"] = retries
    for key in manager.pools.keys():
        pool = manager.pools.get(key)
        if pool is not None:
            pool.retries = retries


@dataclass(frozen=True)
class Request:
    """What a request does, as its errors and retry log lines name it."""

    verb: str
    plural: str
    namespace: str
    name: Optional[str] = None

    def failed(self, exc: Exception) -> ScalingError:
        """The typed error of an API exception (a typed error as it is)."""
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, ScalingError):
            return exc
        verb, plural = self.verb, self.plural
        where = f"{plural} {self.name!r}" if self.name else plural
        where = f"{where} in namespace {self.namespace!r}"
        if cert_verification_failed(exc):
            return CertificateRefusedError(
                f"{verb} {where}: the API server's TLS certificate was refused ({type(exc).__name__}: "
                f"{redact(exc)}); nothing was sent (check the kubeconfig's certificate-authority and server address)"
            )
        if not isinstance(exc, ApiException):
            return BackendUnavailableError(f"{verb} {where} failed: {type(exc).__name__}: {redact(exc)}")
        status, message = exc.status or 0, _status_message(exc)
        if status in (401, 403):
            return UnauthorizedError(
                f"Kubernetes refused to {verb} {where} (RBAC): {message}. Grant the '{verb}' verb on '{plural}' "
                "(see the Role for the cluster's kind in examples/k8s/: rbac.yaml, kuberay-rbac.yaml, "
                "dask-operator-rbac.yaml)", status_code=status,
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


def _status_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "reason", "") or exc)


class KubeApi:
    """Cluster objects and pods in one namespace-agnostic client; urllib3 itself never retries."""

    def __init__(self, api_client: Any, request_timeout: float = 30.0) -> None:
        from kubernetes import client

        _limit_retries(api_client)
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.request_timeout = request_timeout
        host = getattr(api_client.configuration, "host", "") or ""
        self.outage = shared_tracker(f"the Kubernetes API server {host}".rstrip(), logger)
        """Reachability of the API server, shared by every client of it in this process."""

    def _call(
        self, request: Request, call: Callable[[float], Any], deadline: Optional[Deadline], rule: RetryRule
    ) -> Any:
        try:
            return send(
                lambda: call(attempt_timeout(self.request_timeout, deadline)), tracker=self.outage,
                rule=rule, deadline=deadline, what=f"{request.verb} {request.plural}",
            )
        except Exception as exc:  # noqa: BLE001 - translated
            raise request.failed(exc) from None

    def read_object(
        self, resource: Resource, namespace: str, name: str, deadline: Optional[Deadline] = None,
        rule: RetryRule = READS,
    ) -> Dict[str, Any]:
        """Custom object ``name`` as a dict."""
        return self._call(Request("get", resource.plural, namespace, name), lambda timeout: (
            self.custom.get_namespaced_custom_object(
                resource.group, resource.version, namespace, resource.plural, name, _request_timeout=timeout
            )
        ), deadline, rule)

    def list_objects(
        self, resource: Resource, namespace: str, selector: str = "", deadline: Optional[Deadline] = None,
        rule: RetryRule = READS,
    ) -> Tuple[List[Dict[str, Any]], str]:
        """The pods or custom objects of ``resource`` matching ``selector``, and the list's
        resourceVersion (what a watch starts from)."""

        def call(timeout: float) -> Tuple[List[Dict[str, Any]], str]:
            response = self._list(resource, namespace, label_selector=selector, _request_timeout=timeout)
            data = json.loads(response.data)
            return data.get("items") or [], str(data["metadata"]["resourceVersion"])

        return self._call(Request("list", resource.plural, namespace), call, deadline, rule)

    def _list(self, resource: Resource, namespace: str, **options: Any) -> Any:
        """The raw answer of a list (or watch) of ``resource``: pods through the core API, others as custom objects."""
        if resource.is_pods:
            return self.core.list_namespaced_pod(namespace, _preload_content=False, **options)
        return self.custom.list_namespaced_custom_object(
            resource.group, resource.version, namespace, resource.plural, _preload_content=False, **options
        )

    def patch_object(
        self, resource: Resource, namespace: str, name: str, patch: Dict[str, Any],
        deadline: Optional[Deadline] = None, rule: RetryRule = WRITES,
    ) -> Dict[str, Any]:
        """One JSON merge patch of custom object ``name``; returns the object after it."""
        return self._call(Request("patch", resource.plural, namespace, name), lambda timeout: (
            self.custom.patch_namespaced_custom_object(
                resource.group, resource.version, namespace, resource.plural, name, patch,
                _content_type=MERGE_PATCH, _request_timeout=timeout,
            )
        ), deadline, rule)

    def delete_pod(self, namespace: str, name: str, uid: str, deadline: Optional[Deadline] = None) -> Dict[str, Any]:
        """Delete pod ``name`` only if it still has ``uid`` (409 :class:`Conflict` otherwise)."""
        from kubernetes import client

        response = self._call(Request("delete", "pods", namespace, name), lambda timeout: (
            self.core.delete_namespaced_pod(
                name, namespace, body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
                _preload_content=False, _request_timeout=timeout,
            )
        ), deadline, WRITES)
        return json.loads(response.data)  # type: ignore[no-any-return]

    def watch(
        self, resource: Resource, namespace: str, version: str, seconds: float,
        on_open: Optional[Callable[[Any], None]] = None, stopped: Optional[Callable[[], bool]] = None,
    ) -> Iterator[Dict[str, Any]]:
        """Events (``{"type", "object"}``) of ``resource`` after resourceVersion ``version`` for about
        ``seconds`` (connecting too). :class:`WatchExpired` on 410, :class:`BackendUnavailableError` when
        the stream breaks. ``on_open(response)`` gets the stream, so another thread can end it
        (``response.shutdown()``); ``stopped()`` then says so and the watch ends quietly."""
        from urllib3.exceptions import ReadTimeoutError

        options = dict(
            watch=True, resource_version=version, timeout_seconds=max(1, math.ceil(seconds)),
            allow_watch_bookmarks=True,
            _request_timeout=(min(self.request_timeout, max(0.05, seconds)), max(0.05, seconds)),
        )
        request = Request("watch", resource.plural, namespace)
        try:
            # One attempt: the informer lists and watches again, riding out an outage there.
            opening = lambda: self._list(resource, namespace, **options)  # noqa: E731
            response = send(opening, tracker=self.outage, rule=ONCE, what="watch")
        except Exception as exc:  # noqa: BLE001 - translated
            raise request.failed(exc) from None
        try:
            if on_open is not None:
                on_open(response)
            yield from _events(response, request)
        except ScalingError:
            raise
        except ReadTimeoutError:
            return
        except Exception as exc:  # noqa: BLE001 - a dropped stream is expected; the caller resumes
            if stopped is not None and stopped():
                return
            # A stream cut mid-way is how a restarting server goes away: its 401/403 once back is ridden out.
            self.outage.interrupted()
            raise BackendUnavailableError(
                f"watch of {resource.plural} in namespace {namespace!r} broke: {type(exc).__name__}"
            ) from None
        finally:
            # Close rather than return a half-read stream to the pool.
            response.close()
            response.release_conn()

    def close(self) -> None:
        """Close the connection pool."""
        self.api_client.close()


def _events(response: Any, request: Request) -> Iterator[Dict[str, Any]]:
    """The events of an open watch stream; an ERROR event raised as its typed error."""
    from kubernetes.watch.watch import iter_resp_lines

    for line in iter_resp_lines(response):
        if not line:
            continue
        event = json.loads(line)
        if event.get("type") == "ERROR":
            status = event.get("object") or {}
            if status.get("code") == 410:
                raise WatchExpired(f"watch {request.plural}: {status.get('message')}", status_code=410)
            raise BackendUnavailableError(
                f"watch {request.plural} in namespace {request.namespace!r} failed: {status.get('message')}",
                status_code=status.get("code"),
            )
        yield event
