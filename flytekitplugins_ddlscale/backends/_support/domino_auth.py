"""Credentials for Domino services, as an ``httpx.Auth``; a token kept in a file (:class:`TokenFile`, also the
Kubernetes backend's service-account token).

The first available wins: a ``token`` or ``api_key`` argument, ``$DOMINO_API_PROXY``'s ``/access-token``
(fetched anew once on a 401 or 403: the scaler service answers an expired token with 403), ``$DOMINO_TOKEN``,
``$DOMINO_TOKEN_FILE`` (read again when it changes), ``$DOMINO_API_KEY`` (docs/scaler.md). A proxy that is
unreachable or answers 429/5xx is a :class:`ProxyUnavailableError`, ridden out as an outage. Every value read
is registered with :mod:`.redaction`, so it never reaches logs or errors.
"""
import os
import threading
from typing import Any, Generator, Mapping, Optional, Tuple, Union

import httpx

from ..._core import settings
from ...errors import BackendUnavailableError, CertificateRefusedError, UnauthorizedError
from ..._core.outage import cert_verification_failed
from ..._core.redaction import register_secret

API_KEY_HEADER = "X-Domino-Api-Key"
REFRESH_STATUSES = (401, 403)
"""Answers after which a proxy token is fetched anew and the request sent once more."""
UNAVAILABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Answers of ``/access-token`` from a proxy that is overloaded or restarting."""


class ProxyUnavailableError(BackendUnavailableError):
    """``$DOMINO_API_PROXY`` could not hand out a token now (unreachable, or 429/5xx): no request
    was sent with it, so the request is safe to try again."""

    nothing_sent = True
    """Read by :func:`~flytekitplugins_ddlscale._core.outage.nothing_sent`: an outage symptom, safe to repeat."""


class TokenFile:
    """A token kept in a file (a mounted Secret, a service account's token): :meth:`read` gives it as the file
    holds it now, read again only when the file changed (Kubernetes swaps a rotated one in one rename)."""

    def __init__(self, path: str, what: str) -> None:
        self.path, self.what = path, what
        self._read: Tuple[Any, str] = (None, "")

    def read(self) -> str:
        """The token; :class:`UnauthorizedError` naming :attr:`what` when the file cannot be read."""
        try:
            info = os.stat(self.path)
            stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
            if stamp != self._read[0]:
                with open(self.path, encoding="utf-8") as file:
                    token = file.read().strip()
                register_secret(token)
                self._read = (stamp, token)
        except (OSError, ValueError) as exc:
            raise UnauthorizedError(f"could not read {self.what}: {getattr(exc, 'strerror', None) or exc}") from None
        return self._read[1]


class DominoAuth(httpx.Auth):
    """Adds Domino credentials to each request; refreshes a proxy token once on 401 or 403."""

    def __init__(
        self, *, token: Optional[str] = None, api_key: Optional[str] = None, api_proxy: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None, proxy_timeout: float = 10.0, verify: bool = True,
    ) -> None:
        self._lock = threading.Lock()
        self._proxy_token: Optional[str] = None
        self._proxy_timeout = proxy_timeout
        self._verify = verify
        self.api_proxy: Optional[str] = None
        self._bearer: Union[str, TokenFile, None] = None
        self.api_key: Optional[str] = None
        proxy = settings.DOMINO_API_PROXY.value(api_proxy or None, env, field="api_proxy")
        if token or api_key:
            self._bearer, self.api_key = token, api_key
        elif proxy:
            self.api_proxy = proxy.rstrip("/")
        elif settings.DOMINO_TOKEN.is_set(env):
            self._bearer = settings.DOMINO_TOKEN.value(env=env)
        elif settings.DOMINO_TOKEN_FILE.is_set(env):
            path = settings.DOMINO_TOKEN_FILE.value(env=env)
            self._bearer = TokenFile(path, f"the token in {settings.DOMINO_TOKEN_FILE.name}={path}")
        elif settings.DOMINO_API_KEY.is_set(env):
            self.api_key = settings.DOMINO_API_KEY.value(env=env)
        for value in (self._bearer, self.api_key):
            if isinstance(value, str) and value:
                register_secret(value)

    @property
    def token(self) -> Optional[str]:
        """The bearer token: given, from ``$DOMINO_TOKEN``, or the token file's as it is now."""
        return self._bearer.read() if isinstance(self._bearer, TokenFile) else self._bearer

    @property
    def source(self) -> str:
        """Where credentials come from: ``proxy``, ``token``, ``api_key`` or ``none``."""
        if self.api_proxy:
            return "proxy"
        if self._bearer:
            return "token"
        if self.api_key:
            return "api_key"
        return "none"

    def _fetch_proxy_token(self) -> str:
        url = f"{self.api_proxy}/access-token"
        try:
            response = httpx.get(url, timeout=self._proxy_timeout, verify=self._verify)
        except httpx.HTTPError as exc:
            if cert_verification_failed(exc):
                raise CertificateRefusedError(
                    "could not get an access token from DOMINO_API_PROXY: its TLS certificate was refused; "
                    "nothing was sent"
                ) from None
            raise ProxyUnavailableError(
                f"could not get an access token from DOMINO_API_PROXY ({type(exc).__name__})"
            ) from None
        if response.status_code != 200:
            failed = ProxyUnavailableError if response.status_code in UNAVAILABLE_STATUSES else UnauthorizedError
            raise failed(
                f"DOMINO_API_PROXY /access-token answered HTTP {response.status_code}", status_code=response.status_code
            )
        token = response.text.strip()
        register_secret(token)
        return token

    def _current_proxy_token(self, stale: Optional[str] = None) -> str:
        with self._lock:
            if self._proxy_token is None or self._proxy_token == stale:
                self._proxy_token = self._fetch_proxy_token()
            return self._proxy_token

    def _apply(self, request: httpx.Request, token: Optional[str]) -> None:
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        elif self.api_key:
            request.headers[API_KEY_HEADER] = self.api_key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if not self.api_proxy:
            self._apply(request, self.token)
            yield request
            return
        token = self._current_proxy_token()
        self._apply(request, token)
        response = yield request
        if response.status_code in REFRESH_STATUSES:
            self._apply(request, self._current_proxy_token(stale=token))
            yield request
