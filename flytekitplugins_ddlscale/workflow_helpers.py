"""A failure handler that scales a cluster down when a workflow fails: it declares the workflow's own inputs
(plus an optional ``err``), as flytekit runs ``on_failure`` with them; assign it to a module-level variable so a
container finds it. Example: docs/flyte.md, Failures."""
import logging
from typing import Any, Dict, Optional, Union

from flytekit.core.interface import Interface
from flytekit.core.python_function_task import PythonInstanceTask
from flytekit.types.error import FlyteError

from .backends._base import DEFAULT_SCALE_TIMEOUT
from ._services.opening import connected  # noqa: F401 - public here, as before it moved to the core
from .errors import InvalidInputError
from ._services.nodes.names import qualified_name
from ._services.nodes.restore import RestoreOutcome, restore_line
from ._services.opening import open_backend
from ._core.progress import emit_line
from .refs import ClusterRef, cluster_text, parse_cluster
from ._core.validation import validate_replicas, validate_timeout

logger = logging.getLogger("flytekitplugins_ddlscale")

ERROR_INPUT = "err"


class ScaleDownOnFailure(PythonInstanceTask[None]):
    """A failure-handler task for ``@workflow(on_failure=...)``: restore ``cluster``'s recorded baseline
    (nothing when none is recorded), or scale it to ``replicas``. ``inputs`` are the workflow's
    (``kwtypes(...)``), as flytekit requires; the Flyte name is qualified by the defining module."""

    def __init__(
        self,
        name: str,
        cluster: Union[str, ClusterRef],
        inputs: Optional[Dict[str, type]] = None,
        replicas: Optional[int] = None,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        backend: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        self._cluster = cluster_text(cluster)
        self._replicas = None if replicas is None else validate_replicas(replicas)
        self._timeout = validate_timeout(timeout)
        self._backend = backend
        declared = dict(inputs or {})
        if ERROR_INPUT in declared:
            raise InvalidInputError("inputs", sorted(declared), f"workflow inputs not named {ERROR_INPUT!r}")
        signature: Dict[str, Any] = dict(declared)
        signature[ERROR_INPUT] = (Optional[FlyteError], None)
        super().__init__(name=name, task_config=None, interface=Interface(inputs=signature, outputs={}), **kwargs)

    @property
    def name(self) -> str:
        """The task's Flyte name: qualified by the defining module unless the given name has a dot."""
        return qualified_name(self._name, self.instantiated_in)

    def get_custom(self, settings: Any) -> Dict[str, Any]:
        """The cleanup target, visible in the serialized template."""
        return {"cluster": self._cluster, "replicas": self._replicas, "timeout": self._timeout, "backend": self._backend}

    def execute(self, **kwargs: Any) -> None:
        """Scale down after a failure and print the summary line; a cluster with nothing recorded is left as it is."""
        err = kwargs.get(ERROR_INPUT)
        ref = parse_cluster(self._cluster)
        failed = f" at {err.failed_node_id}: {err.message}" if err is not None else ""
        logger.warning("workflow failed%s; scaling %s down", failed, ref)
        with open_backend(self._backend) as backend:
            if self._replicas is not None:
                result, restored = backend.scale(ref, self._replicas, wait=True, timeout=self._timeout), "given size"
            elif backend.get_baseline(ref) is not None:
                result, restored = backend.restore_baseline(ref, wait=True, timeout=self._timeout), "baseline"
            else:
                logger.info("no baseline recorded for %s: nothing to restore", ref)
                return
            emit_line(restore_line(self._name, RestoreOutcome.from_result(result, backend.name, restored)))


scale_down_on_failure = ScaleDownOnFailure
"""A task for ``@workflow(on_failure=...)`` that scales ``cluster`` down: :class:`ScaleDownOnFailure`."""
