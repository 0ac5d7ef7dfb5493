"""Waiting until N workers have registered with the framework on the cluster's head, or until it
has dropped the workers a scale-down removed.

Reads the head's JSON status (:mod:`.probes`) on a fast schedule until the
count reaches the target (:func:`wait_registered`: at least N; after a
scale-down, at most N) or the deadline passes. A head that does not answer
(connection refused, reset, timeout, a 5xx, a payload of another shape) is
retried until the deadline: heads restart and dashboards start after the
pod is Ready. Redirects are not followed and no part of an answer's body
reaches a message: the URL may point anywhere its writer chose. Each outage is logged once when it starts and once when it
ends, by the same :class:`~flytekitplugins_ddlscale._core.outage.OutageTracker`
the backends use. Only 401/403 ends the wait early: retrying cannot fix
credentials.
"""
import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from ..errors import ScalingTimeoutError, UnauthorizedError
from ..models import ClusterState
from .._core.outage import OutageTracker
from .._core.peerowner import NoRedirects, own_peer_opener
from .._core.progress import ProgressReporter, WaitProgress
from .._core.waiting import Deadline, PollSchedule, TwoStageBackoff, poll
from .._core.wording import seconds
from .endpoints import Endpoint
from .probes import Probe
from .._core.settings import RAY_AUTH_MODE, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH
from .ray_auth import ray_auth_headers

logger = logging.getLogger("flytekitplugins_ddlscale")

DEFAULT_SCHEDULE = TwoStageBackoff(initial=0.1, fast=0.25, fast_until=120.0, slow=2.0)
"""0.1 s doubling to 0.25 s for two minutes, then 2 s: workers usually join seconds after their pod."""
READ_TIMEOUT = 5.0
"""Seconds one status read may take (less when the deadline is closer)."""
MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""Largest status answer read (a Ray node list of 10000 nodes is a few MB)."""


@dataclass(frozen=True)
class Registered:
    """What the framework showed when the wait ended."""

    kind: str
    url: str
    workers: int
    """Workers registered at the last read (at least the target; at most it after a scale-down)."""
    proof: str
    """In words: ``4 workers registered with the Dask scheduler at http://h:8787``."""
    seconds: float


class HeadUnreachable(Exception):
    """One read of the head's status failed in a way a later read may not."""


_OPENER = urllib.request.build_opener(NoRedirects())
"""The probes' opener: the head's own URL only (a redirect could point anywhere, even at ``ftp://``)."""
_CREDENTIALS_OPENER = own_peer_opener()
"""The opener of reads carrying a token: to a loopback port, only once this user's process accepted."""


def get_json_body(url: str, headers: Dict[str, str], timeout: float) -> bytes:
    """The body of a GET of ``url`` asking for JSON (with ``headers``), redirects not followed; at most
    :data:`MAX_ANSWER_BYTES` + 1 bytes, so a longer answer shows. Raises what ``urllib`` raises; a read
    carrying ``Authorization`` to a loopback port held by another user sends nothing and raises
    :class:`~flytekitplugins_ddlscale._core.peerowner.ForeignListenerError` (an ``OSError``) inside a ``URLError``."""
    request = urllib.request.Request(url, headers={"Accept": "application/json", **headers})
    opener = _CREDENTIALS_OPENER if "Authorization" in headers else _OPENER
    with opener.open(request, timeout=timeout) as reply:
        return reply.read(MAX_ANSWER_BYTES + 1)


def read_registered(probe: Probe, endpoint: Endpoint, timeout: float) -> int:
    """Registered workers now; :class:`HeadUnreachable` when the head did not answer usefully.

    Redirects are not followed (a 3xx is a failed read). Error messages name
    the URL and what failed, never any part of the answer's body or status
    line. A Ray head is read with the token of Ray's token authentication when
    this process's environment turns it on (:mod:`.ray_auth`: a local
    cluster's connection variables do). Raises :class:`UnauthorizedError` on 401/403.
    """
    url = probe.url(endpoint.url)
    # A Ray head with token authentication (local clusters) wants the token ray.init would send.
    auth = ray_auth_headers() if probe.kind == "ray" else {}
    try:
        body = get_json_body(url, auth, timeout)
    except urllib.error.HTTPError as error:
        error.close()
        if error.code in (401, 403):
            raise UnauthorizedError(
                f"{probe.registry} at {endpoint.url} refused the status read (HTTP {error.code}); "
                f"{_credentials_sent(probe, bool(auth))}",
                status_code=error.code,
            ) from None
        if 300 <= error.code < 400:
            raise HeadUnreachable(f"HTTP {error.code} redirect from {url}, not followed") from None
        raise HeadUnreachable(f"HTTP {error.code} from {url}") from None
    except http.client.HTTPException as error:
        # Its text may quote what the other end sent (BadStatusLine: the banner of whatever listens there).
        raise HeadUnreachable(f"{type(error).__name__}: not an HTTP answer ({url})") from None
    except OSError as error:
        cause = error.reason if isinstance(error, urllib.error.URLError) and isinstance(error.reason, Exception) else error
        raise HeadUnreachable(f"{type(cause).__name__}: {cause} ({url})") from None
    if len(body) > MAX_ANSWER_BYTES:
        raise HeadUnreachable(f"answer larger than {MAX_ANSWER_BYTES} bytes ({url})")
    try:
        payload = json.loads(body.decode("utf-8"))
    except ValueError:
        raise HeadUnreachable(f"not a JSON answer ({url})") from None
    try:
        return probe.count(payload)
    except ValueError as error:
        raise HeadUnreachable(f"{error} ({url})") from None


def _credentials_sent(probe: Probe, token_sent: bool) -> str:
    """What the refused read carried and what would fix it (never the token itself)."""
    if probe.kind != "ray":
        return ("the framework check sends no credentials: give the URL of a head port that needs none, "
                "or switch the check off")
    if token_sent:
        return (f"the token of Ray's token authentication was sent ({RAY_AUTH_MODE.name}=token, from ${RAY_AUTH_TOKEN.name}, "
                f"else the file ${RAY_AUTH_TOKEN_PATH.name} names, else ~/.ray/auth_token): check it is this cluster's token")
    return (f"no token was sent: a Ray head with token authentication needs {RAY_AUTH_MODE.name}=token and the token "
            f"in ${RAY_AUTH_TOKEN.name} or a file named by ${RAY_AUTH_TOKEN_PATH.name}, as ray.init does; or give the URL of a head "
            "port that needs none, or switch the check off")


def wait_registered(
    probe: Probe,
    endpoint: Endpoint,
    workers: int,
    timeout: float,
    *,
    removed: bool = False,
    cluster: Optional[str] = None,
    state: Optional[ClusterState] = None,
    progress: Optional[ProgressReporter] = None,
    schedule: PollSchedule = DEFAULT_SCHEDULE,
    sleep: Callable[[float], None] = time.sleep,
) -> Registered:
    """Return once at least ``workers`` workers are registered with the head at ``endpoint``; with
    ``removed`` (after a scale-down), once at most ``workers`` are: the framework has dropped the
    workers the change removed.

    Reads at least once even when ``timeout`` is (nearly) spent. Raises
    :class:`ScalingTimeoutError` at ``timeout`` naming what it waited for,
    the last count (after a scale-down: the workers still registered), and
    how long the head had been unreachable; ``state`` (the backend's last
    state) travels with the error.
    """
    if removed:
        what = f"{probe.registry} at {endpoint.url} to drop the removed workers (at most {workers} registered)"
        behind = ("; the removed workers are still registered: their processes have not stopped or the head "
                  "has not noticed yet")
    else:
        what, behind = f"{workers} workers registered with {probe.registry} at {endpoint.url}", ""
    deadline = Deadline(max(timeout, 0.0))
    tracker = OutageTracker(f"{probe.registry} at {endpoint.url}", logger)
    seen: Optional[int] = None
    last_error = ""

    def read() -> Optional[float]:  # the seconds the head has been unreachable, None while it answers
        nonlocal seen, last_error
        try:
            seen = read_registered(probe, endpoint, max(0.2, min(READ_TIMEOUT, deadline.remaining)))
        except HeadUnreachable as error:
            last_error = str(error)
            tracker.failed(last_error)
        else:
            tracker.recovered()
        outage = tracker.current_outage()
        detail = f"head unreachable for {outage:.1f}s: {last_error}" if outage is not None else f"{seen} registered"
        if progress is not None:
            progress(WaitProgress(what, seen or 0, workers, deadline.elapsed, timeout, detail))
        return outage

    def done(outage: Optional[float]) -> bool:
        return outage is None and seen is not None and (seen <= workers if removed else seen >= workers)

    def timed_out(outage: Optional[float]) -> ScalingTimeoutError:
        last = "the head never answered" if seen is None else f"{seen} registered at its last answer"
        if outage is not None and seen is not None:
            last += f"; then unreachable for {outage:.1f}s ({last_error})"
        elif outage is not None:
            last += f" for {outage:.1f}s ({last_error})"
        elif seen is not None:
            last += behind
        return ScalingTimeoutError(
            f"timed out after {seconds(timeout)} waiting for {what} (address from {endpoint.source}); {last}",
            cluster=cluster,
            state=state,
        )

    poll(read, done, deadline=deadline, schedule=schedule, timed_out=timed_out, sleep=sleep)
    proof = f"{seen} workers registered with {probe.registry} at {endpoint.url}"
    return Registered(probe.kind, endpoint.url, seen or 0, proof, deadline.elapsed)
