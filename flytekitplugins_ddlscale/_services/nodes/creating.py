"""What a node type's connector ``create`` works with: the policy's checks, the send bound, what it sent.

A connector serves a node in two steps (:mod:`..connector_core`): ``create``
checks the node and sends its change without waiting, then each poll reads
the cluster until the node's goal is reached. Each node type says what its
``create`` sends (``NodeKind.create``) through a :class:`Creation`, and
returns a :class:`Sent`: what the polls wait for and the outcome known so
far. A creation gives the backend at most :data:`CREATE_TIMEOUT` seconds.
"""
import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, TypeVar

from ...errors import BackendUnavailableError, ScalingError, ScalingTimeoutError
from ...models import RestartResult
from ...refs import ClusterRef, parse_cluster
from ..._core.waiting import Deadline
from ..connector_policy import ConnectorPolicy, reported_head_hosts
from ..opening import BackendPool, open_backend

T = TypeVar("T")

CREATE_TIMEOUT = 5.0
"""Seconds ``create`` gives the backend to accept a change (the reads before it, its requests, retries and
locks together).

FlytePropeller gives ``CreateTask`` 10 s by default; the rest is left for
opening the backend and the gRPC round trip. A backend slower than this
makes ``create`` raise (a retryable failure of the node), except for a head
restart, which may have been sent and so ends FAILED instead of being sent again."""
MIN_SEND = 1.0
"""Seconds a change gets when a read before it used up (nearly) all of the create bound."""

AWAIT_WORKERS = "workers"
"""The polls wait for ``target`` workers (none when ``target`` is -1)."""
AWAIT_DESIRED = "desired"
"""The polls wait for as many workers as the cluster desires when they read it (``WaitForCluster`` replicas -1)."""
AWAIT_HEAD = "head"
"""The polls wait for the head the restart in ``restart`` brought up."""
AWAITS = (AWAIT_WORKERS, AWAIT_DESIRED, AWAIT_HEAD)

RESTART_FIELDS = ("pod", "started_at", "head_hw_tier", "replaced_uid")
"""What the polls keep of a head restart ``create`` sent."""


@dataclass(frozen=True)
class Sent:
    """What a node's ``create`` sent to ``cluster``, and what its polls wait for."""

    cluster: ClusterRef
    target: int
    """Workers to wait for; -1 means nothing to wait for."""
    outcome: Any
    """The node's outcome as known now (a dataclass, or a dictionary of its fields); the polls complete it."""
    framework_ready: bool = False
    """Whether the polls also wait for the framework to register the workers."""
    framework_url: str = ""
    awaits: str = AWAIT_WORKERS
    """What the polls wait for: one of :data:`AWAITS`."""
    restart: str = ""
    """JSON of the head restart sent (:func:`restart_json`); '' for none."""


def restart_json(result: RestartResult) -> str:
    """What the polls keep of the head restart ``result`` (:data:`RESTART_FIELDS`)."""
    return json.dumps({name: getattr(result, name) or "" for name in RESTART_FIELDS})


class Creation:
    """What a node type's ``create`` may do under the connector's policy: name the served backend and
    cluster, open the backend checked against the policy, and send within :data:`CREATE_TIMEOUT`.

    With a ``pool`` (the connector's kept backends, the ones its polls read through) a create opens
    its backend there: creates and polls share one client per server and so one outage tracker,
    which then knows the server served this process. A restart right after a create is then
    ridden out by the polls, its 403 included (a tracker the server never served takes a 403 for
    a missing permission); without, each create opens and closes a backend of its own."""

    def __init__(self, policy: ConnectorPolicy, pool: Optional[BackendPool] = None) -> None:
        self.policy = policy
        self.pool = pool

    def served(self, backend_name: Optional[str], cluster: object) -> Tuple[str, ClusterRef]:
        """The served backend name and cluster, or :class:`NotServedError` (nothing opened or sent)."""
        return self.policy.backend(backend_name), parse_cluster(cluster)  # type: ignore[arg-type]

    def check_opened(self, backend: Any, ref: ClusterRef, framework_url: str) -> None:
        """The checks that need the opened backend (its namespace, its head host), before any request."""
        self.policy.check_cluster(ref, backend)
        if framework_url:
            self.policy.check_framework_url(framework_url, reported_head_hosts(backend, ref))

    @contextmanager
    def opened(self, backend_name: str, ref: ClusterRef, framework_url: str = "") -> Iterator[Any]:
        """The backend ``backend_name``, opened (or taken from the pool) and checked for ``ref``
        (:meth:`check_opened`)."""
        opening = self.pool.backend if self.pool is not None else open_backend
        with opening(backend_name) as backend:
            self.check_opened(backend, ref, framework_url)
            yield backend

    @staticmethod
    def sent(what: str, send: Callable[[], T]) -> T:
        """``send()``; a backend that does not accept it within the create bound is
        :class:`BackendUnavailableError` (raised, so the node is retried: use it only for changes that
        are safe to repeat)."""
        try:
            return send()
        except ScalingTimeoutError as error:
            raise BackendUnavailableError(
                f"the backend did not accept {what} within {CREATE_TIMEOUT:g} s (the connector's create bound): "
                f"{error.message}",
                cluster=error.cluster,
            ) from None


def in_place_failure(backend: Any, ref: ClusterRef, error: ScalingError, target: int, *, restoring: bool) -> ScalingError:
    """``error`` of a size change whose wait for ``target`` workers failed, with what the change left in
    place and the command that undoes it (or, after a restore, keeps waiting), as a node whose own
    wait failed says it."""
    return backend.in_place_error(ref, error, target, restoring=restoring)


def read_within(deadline: Deadline, what: str, read: Callable[[], T]) -> T:
    """``read()``, or :class:`BackendUnavailableError` once ``deadline`` passes first.

    For reads the protocol gives no deadline (``get_baseline``): the read goes
    on in a daemon thread and its answer is dropped, which is safe for a read
    and for nothing else.
    """
    answer: Dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            answer["value"] = read()
        except BaseException as error:  # handed to the caller below
            answer["error"] = error
        finally:
            done.set()

    threading.Thread(target=run, name="ddlscale-connector-read", daemon=True).start()
    if not done.wait(deadline.remaining):
        raise BackendUnavailableError(
            f"the backend did not answer {what} within {deadline.timeout:g} s (the connector's create bound)"
        )
    if "error" in answer:
        raise answer["error"]
    return answer["value"]
