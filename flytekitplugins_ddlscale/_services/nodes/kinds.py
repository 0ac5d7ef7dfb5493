"""What a scaling node type is (:class:`NodeKind`, from which both task surfaces and the connector build it),
and what every type shares: configuration and outcome bases, and its connector ``create``'s :class:`Creation`.
A new node type is a module declaring its kind, a line in ``NODE_KINDS`` and one on each surface.
"""
import inspect
import json
import threading
import typing
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, fields
from functools import partial
from typing import (
    Any, Callable, ClassVar, Collection, Dict, Generic, Iterator, Mapping, Optional, Sequence, Tuple, Type, TypeVar,
    Union,
)

from ...errors import BackendUnavailableError, InvalidInputError, ScalingError, ScalingTimeoutError
from ...models import ClusterState, RestartResult, ScaleResult
from ...refs import ClusterRef, parse_cluster
from ..hold.settings import Check, CheckedFields
from ..._core.progress import ProgressReporter
from ..._core.timeline import WorkerTimeline, observed_workers
from ..._core.validation import MAX_NODE_TIMEOUT, validate_timeout
from ..._core.waiting import Deadline
from ..connector_policy import ConnectorPolicy, reported_head_hosts
from ..opening import BackendPool
from ..readiness import FrameworkOptions, Readiness

C = TypeVar("C")
O = TypeVar("O")
T = TypeVar("T")


@dataclass(frozen=True)
class NodeConfig(CheckedFields):
    """A node's configuration: the cluster first, each field checked when made, a round trip through the task
    template's ``custom`` (so a container run and the connector rebuild what was serialized), and a timeout of
    at most :data:`MAX_NODE_TIMEOUT` (what a connector may be asked to keep polling)."""

    cluster: str
    """``kind/name``, ``namespace/kind/name``, or a bare kind for the run's own cluster."""

    checks: ClassVar[Mapping[str, Check]] = {"timeout": partial(validate_timeout, maximum=MAX_NODE_TIMEOUT)}

    def to_custom(self) -> Dict[str, Any]:
        """The configuration as a JSON-compatible dictionary."""
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_custom(cls: Type[C], custom: Dict[str, Any]) -> C:
        """The configuration from :meth:`to_custom`'s dictionary; unknown keys are ignored, and whole numbers
        (a protobuf Struct stores every number as a double) come back to int fields as ints. A ``custom`` that
        is not a dictionary or lacks a required field is :class:`InvalidInputError` naming it."""
        if not isinstance(custom, dict):
            raise InvalidInputError("custom", type(custom).__name__, "a dictionary of the node's configuration")
        types = {f.name: f.type for f in fields(cls)}  # type: ignore[arg-type]
        for f in fields(cls):  # type: ignore[arg-type]
            if f.default is MISSING and f.name not in custom:
                raise InvalidInputError(f"custom.{f.name}", None, f"the {f.name} the node was defined with (required)")
        values = {}
        for key, value in custom.items():
            if key not in types:
                continue
            if types[key] is int and isinstance(value, float) and value.is_integer():
                value = int(value)
            values[key] = value
        return cls(**values)


class ChecksFramework:
    """A node that checks framework readiness (``framework_ready``, ``framework_url`` fields)."""

    framework_ready: bool
    framework_url: Optional[str]

    def framework(self) -> FrameworkOptions:
        """The framework readiness options of this node."""
        return FrameworkOptions(self.framework_ready, self.framework_url)


UNKNOWN = -1
"""Stands for "not observable by this backend" in integer fields (Flyte-friendly None)."""


@dataclass
class NodeOutcome:
    """What every node's outcome starts with. Outcomes hold flat fields of plain types, so they serialize the
    same under every flytekit dataclass transformer and a downstream node binds to one field (``up.effective``)."""

    cluster: str
    """The cluster as ``[namespace/]kind/name``."""
    backend: str
    """The backend's name, e.g. ``kubernetes``."""


def known(value: Optional[int]) -> int:
    """``value``, or :data:`UNKNOWN` for None."""
    return UNKNOWN if value is None else value


def resized(result: ScaleResult, backend: str) -> Dict[str, Any]:
    """The fields every outcome of a size change (a scale, a restore) takes from ``result`` and ``backend``."""
    return dict(
        cluster=result.cluster,
        backend=backend,
        previous_workers=result.previous.desired_workers,
        workers=result.final.desired_workers,
        ready_workers=known(result.final.ready_workers),
        waited=result.waited,
        seconds_waited=result.seconds_waited,
        worker_hw_tier=result.worker_hw_tier or "",
    )


def ready_count(state: ClusterState, readiness: Optional[Readiness]) -> int:
    """The workers to plot as ready at the end: the confirmed readiness's count where known, else ``state``'s."""
    if readiness is not None and readiness.ready_workers is not None:
        return readiness.ready_workers
    return observed_workers(state)


CREATE_TIMEOUT = 5.0
"""Seconds a connector ``create`` gives the backend to accept a change (reads, requests, retries and locks
together): FlytePropeller gives ``CreateTask`` 10 s, the rest is for opening the backend and the round trip."""
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
    """What a node type's connector ``create`` may do under the connector's policy: name the served backend
    and cluster, open it from ``pool`` (the polls' backends) checked against the policy, and send within
    :data:`CREATE_TIMEOUT`."""

    def __init__(self, policy: ConnectorPolicy, pool: BackendPool) -> None:
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
        """The backend ``backend_name``, taken from the pool and checked for ``ref``."""
        with self.pool.backend(backend_name) as backend:
            self.check_opened(backend, ref, framework_url)
            yield backend

    @staticmethod
    def sent(what: str, send: Callable[[], T]) -> T:
        """``send()``; a backend that does not accept it within the create bound is
        :class:`BackendUnavailableError` (so the node is retried: only for changes safe to repeat)."""
        try:
            return send()
        except ScalingTimeoutError as error:
            raise BackendUnavailableError(
                f"the backend did not accept {what} within {CREATE_TIMEOUT:g} s (the connector's create bound): "
                f"{error.message}",
                cluster=error.cluster,
            ) from None


def read_within(deadline: Deadline, what: str, read: Callable[[], T]) -> T:
    """``read()``, or :class:`BackendUnavailableError` once ``deadline`` passes first. For reads the protocol
    gives no deadline (``get_baseline``): the read goes on in a daemon thread and its answer is dropped, which
    is safe for a read and for nothing else."""
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


def _as_created(target: int, state: ClusterState) -> int:
    return target


def _as_raised(backend: Any, ref: ClusterRef, error: ScalingError, target: int) -> ScalingError:
    return error


@dataclass(frozen=True)
class NodeKind(Generic[C, O]):
    """A scaling node type: its task type, configuration, run-time inputs, outcome, run and wording."""

    node: str
    """The node type's name on both surfaces, e.g. ``ScaleCluster``."""
    task_type: str
    config: Type[C]
    inputs: Tuple[str, ...]
    """The configuration fields a flow may also pass when it runs the node (defaults: the configuration's)."""
    output: Type[O]
    title: str
    """The title of the node's Deck or Report tab."""
    summary: Callable[[str, O, Optional[float]], str]
    """The node's one summary line from (node name, outcome, seconds)."""
    run: Callable[..., Tuple[O, WorkerTimeline]]
    """What the node does: ``run(config, progress=..., **inputs)`` gives the outcome and its timeline."""
    create: Callable[[Creation, C, Dict[str, Any]], Sent]
    """A connector's ``create``: ``create(creation, config, inputs)`` checks the node, sends its change without
    waiting (within the creation's bound) and says what the polls wait for."""
    finish: Callable[[Any, ClusterState, float, Readiness], O]
    """A connector poll's outcome once the goal is reached: ``finish(metadata, state, seconds, readiness)``
    completes the outcome ``create`` knew (``metadata.outcome_of(...)``)."""
    goal: str = "waiting for {workers}"
    """What the node's progress bar says it waits for."""
    changes_cluster: bool = True
    """Whether the node changes the cluster (a wait only reads it): an interrupt after it may leave it running."""
    cached: str = ""
    """Why a Flyte cache (``cache=True``) is refused for the node: what a cached run would do wrong."""
    awaited: Callable[[int, ClusterState], int] = _as_created
    """The workers a connector poll waits for, from the ``target`` create set and the state read."""
    failed: Callable[[Any, ClusterRef, ScalingError, int], ScalingError] = _as_raised
    """A connector poll's error when the node fails waiting for ``target`` workers (a size change's says what
    it left in place: the backend's ``in_place_error``)."""
    change: str = "the change"
    """What a connector's ``create`` sends, in its messages (``the scale``)."""
    repeatable: bool = True
    """Whether what ``create`` sends is safe to send again (it sets a size or reads a state): a create that
    meets a backend outage then leaves the send to the polls instead of failing the node."""

    def interface(self, config: C) -> Dict[str, Tuple[Any, Any]]:
        """The node's Flyte inputs: each input's type (from the configuration) and its default (the configured value)."""
        types = typing.get_type_hints(self.config)
        return {name: (types[name], getattr(config, name)) for name in self.inputs}

    def given(self, config: C, inputs: Mapping[str, Any]) -> Dict[str, Any]:
        """The inputs of one run: those ``inputs`` gives, the configured ones for the rest."""
        return {name: inputs.get(name, getattr(config, name)) for name in self.inputs}

    def configure(
        self, args: Sequence[Any], options: Mapping[str, Any], surface_options: Collection[str] = ()
    ) -> Tuple[C, Dict[str, Any]]:
        """The configuration a constructor's arguments after the node's name give, and the surface's options.

        ``args`` and the keywords named like a field fill the configuration; keywords in ``surface_options``
        (flytekit's task options) come back untouched. Any other keyword, a missing or a doubled field raises
        TypeError naming it, as a Python call would; a bad value, the field's own :class:`InvalidInputError`.
        """
        signature = inspect.signature(self.config)
        named = {name: options[name] for name in signature.parameters if name in options}
        rest = {key: value for key, value in options.items() if key not in named}
        unknown = sorted(set(rest) - set(surface_options))
        if unknown:
            allowed = f"the configuration's fields ({', '.join(signature.parameters)})"
            if surface_options:
                allowed += f" and the task options ({', '.join(sorted(surface_options))})"
            raise TypeError(f"{self.node}: unexpected keyword argument {unknown[0]!r}; allowed: {allowed}")
        try:
            bound = signature.bind(*args, **named)
        except TypeError as error:
            raise TypeError(f"{self.node}: {error}") from None
        return self.config(*bound.args, **bound.kwargs), rest

    def signature(self, trailing: inspect.Parameter) -> inspect.Signature:
        """A constructor's signature for ``help()`` and notebooks: ``name``, the configuration's fields
        (``cluster`` also as a :class:`ClusterRef`), then the surface's ``trailing`` parameter."""
        parameters = [
            parameter.replace(annotation=Union[str, ClusterRef]) if parameter.name == "cluster" else parameter
            for parameter in inspect.signature(self.config).parameters.values()
        ]
        return inspect.Signature([_NAME, *parameters, trailing])

    def perform(self, config: C, inputs: Mapping[str, Any], progress: ProgressReporter) -> Tuple[O, WorkerTimeline]:
        """Run the node once with ``inputs`` as its inputs."""
        return self.run(config, progress=progress, **self.given(config, inputs))


_NAME = inspect.Parameter("name", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)
"""Every node's first parameter: its name."""
