"""Waiting until N workers have registered with the cluster's head (or it dropped those a scale-down removed).
A head that does not answer usefully is read again until the deadline; only 401/403 ends the wait early. No
part of an answer's body reaches a message: the URL may point anywhere its writer chose."""
import http.client
import json
import logging
import time
import urllib.error
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import ScalingTimeoutError, UnauthorizedError
from .._core.outage import OutageTracker
from .._core.progress import ProgressReporter, WaitProgress, seconds
from .._core.waiting import Deadline, TwoStageBackoff, poll
from .endpoints import Endpoint
from .probes import MAX_ANSWER_BYTES, PROBES, Probe, get_json_body, ray_auth_headers
from .._core.settings import RAY_AUTH_MODE, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH

logger = logging.getLogger("flytekitplugins_ddlscale")

DEFAULT_SCHEDULE = TwoStageBackoff(initial=0.1, fast=0.25, fast_until=120.0, slow=2.0)
"""0.1 s doubling to 0.25 s for two minutes, then 2 s: workers usually join seconds after their pod."""
READ_TIMEOUT = 5.0
"""Seconds one status read may take (less when the deadline is closer)."""


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


def read_registered(probe: Probe, endpoint: Endpoint, timeout: float) -> int:
    """Registered workers now; :class:`HeadUnreachable` when the head did not answer usefully (a redirect
    included), :class:`UnauthorizedError` on 401/403. A Ray head is read with Ray's token where set."""
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


class _Reads:
    """The reads of one wait on a head: the last count, the last failure, and the head's outage."""

    def __init__(self, probe: Probe, endpoint: Endpoint, deadline: Deadline) -> None:
        self.probe, self.endpoint, self.deadline = probe, endpoint, deadline
        self.tracker = OutageTracker(f"{probe.registry} at {endpoint.url}", logger)
        self.seen: Optional[int] = None
        self.last_error = ""

    def read(self) -> Optional[float]:
        """Read the count once; the seconds the head has been unreachable, None while it answers."""
        try:
            self.seen = read_registered(self.probe, self.endpoint, max(0.2, min(READ_TIMEOUT, self.deadline.remaining)))
        except HeadUnreachable as error:
            self.last_error = str(error)
            self.tracker.failed(self.last_error)
        else:
            self.tracker.recovered()
        return self.tracker.current_outage()

    def detail(self, outage: Optional[float]) -> str:
        """The progress line's detail: the count, or how long the head has been unreachable and why."""
        return f"head unreachable for {outage:.1f}s: {self.last_error}" if outage is not None else f"{self.seen} registered"

    def last(self, outage: Optional[float], behind: str) -> str:
        """What the head said last, for a timeout's message (``behind``: why a count that answered fell short)."""
        last = "the head never answered" if self.seen is None else f"{self.seen} registered at its last answer"
        if outage is not None and self.seen is not None:
            return last + f"; then unreachable for {outage:.1f}s ({self.last_error})"
        if outage is not None:
            return last + f" for {outage:.1f}s ({self.last_error})"
        return last + (behind if self.seen is not None else "")


def wait_registered(
    endpoint: Endpoint,
    workers: int,
    timeout: float,
    *,
    removed: bool = False,
    progress: Optional[ProgressReporter] = None,
    **context: Any,
) -> Registered:
    """Return once at least ``workers`` are registered with the head at ``endpoint`` (with ``removed``: at
    most), reading at least once; at ``timeout`` a :class:`ScalingTimeoutError` naming what it waited for, the
    last count and how long the head was unreachable, with ``context`` (the cluster and its last state)."""
    probe = PROBES[endpoint.kind]
    if removed:
        what = f"{probe.registry} at {endpoint.url} to drop the removed workers (at most {workers} registered)"
        behind = ("; the removed workers are still registered: their processes have not stopped or the head "
                  "has not noticed yet")
    else:
        what, behind = f"{workers} workers registered with {probe.registry} at {endpoint.url}", ""
    deadline = Deadline(max(timeout, 0.0))
    reads = _Reads(probe, endpoint, deadline)

    def read() -> Optional[float]:
        outage = reads.read()
        if progress is not None:
            progress(WaitProgress(what, reads.seen or 0, workers, deadline.elapsed, timeout, reads.detail(outage)))
        return outage

    def done(outage: Optional[float]) -> bool:
        seen = reads.seen
        return outage is None and seen is not None and (seen <= workers if removed else seen >= workers)

    def timed_out(outage: Optional[float]) -> ScalingTimeoutError:
        return ScalingTimeoutError(
            f"timed out after {seconds(timeout)} waiting for {what} (address from {endpoint.source}); "
            f"{reads.last(outage, behind)}",
            **context,
        )

    poll(read, done, deadline=deadline, schedule=DEFAULT_SCHEDULE, timed_out=timed_out, sleep=time.sleep)
    proof = f"{reads.seen} workers registered with {probe.registry} at {endpoint.url}"
    return Registered(probe.kind, endpoint.url, reads.seen or 0, proof, deadline.elapsed)
