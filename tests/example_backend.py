"""An example backend, not shipped: the one docs/backends.md walks through, and proof that a backend written
from the hooks alone passes the contract suite (tests/test_contract.py's ``example`` world).

Its clusters are small JSON files (``<state dir>/example/<namespace>.<kind>.<name>.json``: the desired size,
how many workers were up before the last change, when it was made and how long new workers take), so a
``ddlscale`` command in another process sees the same clusters; baselines and claims are file records
(:class:`FileRecordsBackend` does them). Other processes find it through an entry point (:func:`registered`).
"""
import json
import os
import time
from pathlib import Path
from typing import Optional, Union

from flytekitplugins_ddlscale.backends import BackendCapabilities
from flytekitplugins_ddlscale.backends._base import Change, WorkersWait
from flytekitplugins_ddlscale.backends._filebacked import FileRecordsBackend
from flytekitplugins_ddlscale.backends._support.filerecords import FileBookkeeping
from flytekitplugins_ddlscale.backends._support.filestore import FileRecordStore, default_state_dir
from flytekitplugins_ddlscale.backends._support.inplace import Reach, state_dir_env
from flytekitplugins_ddlscale.backends._support.privatefs import private_dir, read_record_text, write_json
from flytekitplugins_ddlscale.errors import ClusterNotFoundError, UnsupportedOperationError
from flytekitplugins_ddlscale.models import Baseline, ClusterState, ReplicaSpec, RestartResult, ScaleResult, utcnow
from flytekitplugins_ddlscale.refs import ClusterRef
from flytekitplugins_ddlscale._core.progress import ProgressReporter
from flytekitplugins_ddlscale._core.waiting import Awaited, Backoff, Deadline, Pacing, poll_until

MAX_WORKERS = 6
POLL = Backoff(initial=0.02, factor=1.5, cap=0.1)


class ExampleBackend(FileRecordsBackend):
    """Dask clusters in files: a change takes effect at once, its new workers come ``delay`` seconds later."""

    name = "example"
    size_setting = "desired_workers"
    maximum_setting = "max_workers"
    capabilities = BackendCapabilities(frozenset({"dask"}), reads_locally=True)
    locked_step_seconds = None  # a file write meets no outage

    def __init__(self, state_dir: Union[str, Path, None] = None) -> None:
        self.directory = private_dir(state_dir if state_dir is not None else default_state_dir() / self.name)
        self.records = FileBookkeeping(FileRecordStore(self.directory / "records"))

    # What a test does to the world outside the backend (as a test server's controls do).

    def create(self, ref: ClusterRef, replicas: int) -> None:
        """Make the cluster ``ref`` with ``replicas`` workers up."""
        write_json(self._path(ref), {"desired": replicas, "up_before": replicas, "changed_at": 0.0, "delay": 0.0})

    def set_delay(self, ref: ClusterRef, seconds: float) -> None:
        """New workers of ``ref`` come ``seconds`` after each later change."""
        self._write(ref, delay=seconds)

    def desired(self, ref: ClusterRef) -> int:
        """The size ``ref`` is set to, read from its file."""
        return int(self._load(ref)["desired"])

    # The hooks.

    def _observe(self, ref: ClusterRef) -> ClusterState:
        cluster = self._load(ref)
        desired = int(cluster["desired"])
        settled = time.time() >= cluster["changed_at"] + cluster["delay"]
        up = desired if settled else min(int(cluster["up_before"]), desired)
        return ClusterState(str(ref), "Running", desired, up, ready_workers=up, head_ready=True,
                            autoscaling_max=MAX_WORKERS)

    def _observe_for_wait(self, ref: ClusterRef, replicas: int, deadline: Deadline) -> Optional[ClusterState]:
        return self._observe(ref)

    def _observe_before_change(self, ref: ClusterRef, deadline: Deadline, what: str) -> ClusterState:
        return self._observe(ref)

    def _wait_workers(self, ref: ClusterRef, wait: WorkersWait) -> ClusterState:
        awaited = Awaited(f"{wait.replicas} workers of {ref}", wait.replicas,
                          lambda state: state.ready_workers or 0, lambda state: state.workers_up(wait.replicas))
        return poll_until(lambda: self._observe(ref), awaited, wait.timeout, wait.progress, Pacing(POLL))

    def _reach(self, ref: ClusterRef) -> Reach:
        env = state_dir_env(self.directory, self.name)
        return Reach(self.name, ref, env=env or {}, options={"state_dir": str(self.directory)}, cli=env is not None)

    def _apply_size(
        self, ref: ClusterRef, replicas: int, tier: Optional[str], previous: ClusterState, deadline: Deadline
    ) -> Change:
        return Change(self._set(ref, replicas, previous))

    def _apply_baseline(
        self, ref: ClusterRef, baseline: Optional[Baseline], target: Optional[ReplicaSpec], deadline: Deadline
    ) -> Change:
        replicas = target.replicas if target is not None else baseline.replicas if baseline is not None else 0
        return Change(self._set(ref, replicas, self._observe(ref)), restoring=True)

    def _restart_head(
        self, ref: ClusterRef, tier: Optional[str], wait: bool, deadline: Deadline,
        progress: Optional[ProgressReporter],
    ) -> RestartResult:
        if tier is not None:
            raise UnsupportedOperationError("the example backend cannot change the head's tier", cluster=str(ref))
        return RestartResult(str(ref), f"{ref.name}-scheduler", utcnow().isoformat(), True, self._observe(ref), wait)

    # Its files.

    def _set(self, ref: ClusterRef, replicas: int, previous: ClusterState) -> ScaleResult:
        effective = min(replicas, MAX_WORKERS)
        self._write(ref, desired=effective, up_before=previous.ready_workers or 0, changed_at=time.time())
        return ScaleResult.sent(str(ref), previous, replicas, effective, final=self._observe(ref))

    def _path(self, ref: ClusterRef) -> Path:
        return self.directory / f"{ref.namespace or '_'}.{ref.kind}.{ref.name}.json"

    def _load(self, ref: ClusterRef) -> dict:
        try:
            return json.loads(read_record_text(self._path(ref)))
        except FileNotFoundError:
            raise ClusterNotFoundError(f"no example cluster {ref}", cluster=str(ref)) from None

    def _write(self, ref: ClusterRef, **values: float) -> None:
        write_json(self._path(ref), {**self._load(ref), **values})


def registered(folder: Path) -> str:
    """Register :class:`ExampleBackend` as backend ``example`` for processes started with the returned
    ``PYTHONPATH``: an entry point in the group ``flytekitplugins_ddlscale.backends``, as an installed
    package declares it (``entry_points={"flytekitplugins_ddlscale.backends": ["example = ..."]}``)."""
    info = folder / "ddlscale_example_backend-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddlscale-example-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[flytekitplugins_ddlscale.backends]\nexample = tests.example_backend:ExampleBackend\n"
    )
    return os.pathsep.join([str(folder), str(Path(__file__).resolve().parent.parent)])
