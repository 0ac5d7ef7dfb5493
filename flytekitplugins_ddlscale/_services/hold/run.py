"""One run of a distributed phase: claim, reconcile and wait on enter; release and reconcile on exit.

A failure or signal on the way runs the exit's cleanup once; a failed cleanup is attached to the block's
error (the phase's story: docs/guide.md and docs/reliability.md).
"""
import contextlib
import logging
import signal
import threading
import time
import uuid
from types import TracebackType
from typing import Callable, List, Mapping, Optional, Type

from ...backends import get_backend
from ...backends._base import ClusterBackend
from ..._core.deck import publish_deck, render_html
from ..._core.lifetime import environ_set
from ..._core.leases import read_clocks
from ...errors import (
    ClusterFaultError,
    ClusterNotFoundError,
    ConflictError,
    ScalingError,
    ScalingTimeoutError,
    UnsupportedOperationError,
)
from ..readiness import FrameworkOptions, ReadinessCheck
from ...backends._support.inplace import given_back
from ...models import ReplicaSpec
from ..._core.progress import Activity, begin_wait, default_reporter, emit_line, plural, seconds
from ..._core.records import Claim
from ..._core.redaction import install_redaction
from ..._core.summary import PhaseEnd
from ..._core.timeline import WorkerTimeline, observed_workers, recording
from ..._core.waiting import CLEANUP_GRACE, MIN_WAIT, PROBE_GRACE, Deadline, within
from .monitor import Fault, PhaseMonitor
from ..._core.lifetime import pause_point
from .settings import PhaseSettings
from .signals import RELAY, PhaseInterrupted, SignalsAsExceptions, raise_in_thread

Publisher = Callable[[str, WorkerTimeline, Mapping[str, object]], None]
"""Attaches a phase's page when it ends: (title, timeline, facts); a Flyte Deck unless a surface gives another."""

INTERRUPT_MARGIN = 30.0
"""Seconds beyond the phase's timeout that a signal waits for a start or restore under way in another thread."""


def publish_flytekit_deck(title: str, timeline: WorkerTimeline, facts: Mapping[str, object]) -> None:
    """The phase's page as the flytekit Deck ``Distributed phase`` of the running task."""
    publish_deck("Distributed phase", render_html(title, timeline, facts))


logger = logging.getLogger("flytekitplugins_ddlscale")


class ClusterPhase:
    """Context manager holding a cluster at the phase's size for the length of a block."""

    def __init__(self, settings: PhaseSettings, label: str = "phase", publish: Publisher = publish_flytekit_deck) -> None:
        install_redaction()
        self.settings = settings
        self.publish = publish
        self.label = label
        self.claim_id = f"{label}-{uuid.uuid4().hex[:12]}"
        self.ref = settings.ref()
        self.timeline = WorkerTimeline()
        self.claim: Optional[Claim] = None
        self.framework_check: Optional[str] = None
        self.restored_to: Optional[str] = None
        self.restore_error: Optional[BaseException] = None
        self.body_failure: Optional[str] = None
        """Set by a caller whose block failed without raising (``exit 7`` for a command), for the summary."""
        self._backend: Optional[ClusterBackend] = None
        self._monitor: Optional[PhaseMonitor] = None
        self.fault_error: Optional[ClusterFaultError] = None
        """With ``fail_on_fault``: the error the phase raises because of a fault during the body."""
        self._in_body = False
        self._gave_back = False
        """Whether the cleanup's reconcile set the cluster (an earlier change's error text is then out of date)."""
        self._signals = SignalsAsExceptions()
        self._env = contextlib.ExitStack()
        self._claimed = False
        self._finished = False
        self._finish_lock = threading.Lock()
        self._ended = threading.Event()
        self._starter: Optional[int] = None
        """The thread running ``_start`` while it runs (None before and after)."""
        self._relayed = False
        self._began = time.monotonic()
        self._scaled: Optional[tuple] = None
        """(workers before, workers held, seconds until ready) once the cluster reached the phase's size."""
        self._found: Optional[tuple] = None
        """(workers up, workers the cluster wants) when the phase's wait ended."""
        self._start_timed_out = False
        """Whether the start ran out of the phase's timeout: the restore then gets :data:`CLEANUP_GRACE`."""

    def __enter__(self) -> "ClusterPhase":
        guard = self._signals.install()
        if not guard.active:
            self._relayed = RELAY.attach(self)
            if not self._relayed:
                logger.debug("phase %s runs without signal handlers", self.claim_id)
        self._starter = threading.get_ident()
        try:
            self._start()
        except BaseException as exc:
            self._starter = None
            self._finish(exc)
            self._uninstall()
            raise
        self._starter = None
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self._finish(exc)
        finally:
            self._uninstall()
        if self.fault_error is not None:
            raise self.fault_error from exc
        if exc is None and self.restore_error is not None:
            raise self.restore_error
        pending = self._signals.guard.pending
        if exc is None and pending is not None:
            raise PhaseInterrupted(pending)

    def _uninstall(self) -> None:
        self._signals.uninstall()
        if self._relayed:
            RELAY.detach(self)
            self._relayed = False

    def interrupt(self, signum: int) -> None:
        """Give the cluster back now because of ``signum`` (the relay calls this in the main thread): here
        during the block, else once the start or cleanup under way ends, within the timeout and a margin."""
        # The block, when it ends, raises PhaseInterrupted for this signal (as in the main thread).
        self._signals.guard.pending = signum
        starter = self._starter
        with self._finish_lock:
            running = not self._finished and starter is None
        if running:
            self._finish(PhaseInterrupted(signum))
            return
        if starter is not None:
            raise_in_thread(starter, signum)
        if not self._ended.wait(self.settings.timeout + INTERRUPT_MARGIN):
            logger.error("phase %s: the restore after %s did not end in time", self.claim_id, signum)

    @property
    def backend(self) -> ClusterBackend:
        """The backend this phase uses (available inside the block)."""
        if self._backend is None:
            raise RuntimeError("the phase has not started")
        return self._backend

    def _start(self) -> None:
        deadline = Deadline(self.settings.timeout)
        # Every check of the head on the way (the claim's read of the size included) gets what is left.
        with within(deadline):
            s = self.settings
            framework = FrameworkOptions(s.framework_ready, s.framework_url)
            framework.check(self.ref.kind)
            self._backend = backend = get_backend(s.backend)
            if self.ref.kind not in backend.capabilities.kinds:
                raise UnsupportedOperationError(
                    f"backend {backend.name!r} serves {sorted(backend.capabilities.kinds)}, not {self.ref.kind!r}",
                    cluster=str(self.ref),
                )
            if s.head_hw_tier is not None and not backend.capabilities.head_tier:
                raise UnsupportedOperationError(
                    f"backend {backend.name!r} cannot change the head tier; drop head_hw_tier or use kubernetes",
                    cluster=str(self.ref),
                )
            claim_sent = read_clocks()
            self.claim = backend.claim(
                self.ref, self.claim_id, s.replicas, s.worker_hw_tier, timeout=max(deadline.remaining, 0.1),
                lease_seconds=s.lease_seconds,
            )
            self._claimed = True
            held = Claim(self.claim_id, s.replicas, s.worker_hw_tier, lease_seconds=s.lease_seconds)
            self._monitor = PhaseMonitor(
                backend, self.ref, held, self.timeline,
                on_fault=self._stop_body if s.fail_on_fault else None, claimed_at=claim_sent,
            )
            self._monitor.start()
            pause_point("claimed")
            self._check_held_tier(backend, self.claim)
            logger.debug(
                "phase %s on %s: needs at least %s; the largest live claim is %d",
                self.claim_id, self.ref, plural(s.replicas, "worker"), self.claim.replicas,
            )
            try:
                self._scale_up(backend, deadline, framework)
            except ScalingTimeoutError as error:
                self._start_timed_out = True
                _name_phase_timeout(error, s.timeout, deadline.elapsed)
                raise
            pause_point("scaled")

    def _scale_up(self, backend: ClusterBackend, deadline: Deadline, framework: FrameworkOptions) -> None:
        """Reconcile to the largest claim and wait, change the head tier, export the variables, confirm
        readiness, and let the monitor watch the body; all within ``deadline``."""
        s = self.settings
        assert self.claim is not None and self._monitor is not None
        with default_reporter(Activity(self.label, str(self.ref))) as reporter:
            begin_wait(reporter, self.claim.replicas, s.timeout)
            result = backend.reconcile(
                self.ref,
                wait=True,
                timeout=max(deadline.remaining, 0.1),
                progress=recording(self.timeline, self.claim.worker_hw_tier, reporter),
                # This phase's own workers: a larger claim of another phase may still be waiting for its own.
                needed=s.replicas,
            )
        if result is None:
            raise ConflictError(
                f"the claim of phase {self.claim_id} vanished before the cluster was scaled "
                "(was `ddlscale restore` run meanwhile?)",
                cluster=str(self.ref),
            )
        self.timeline.add(observed_workers(result.previous), result.previous.worker_hw_tier, seconds=0.0)
        self.timeline.add(observed_workers(result.final), result.final.worker_hw_tier or self.claim.worker_hw_tier)
        self._scaled = (result.previous.desired_workers, result.effective, time.monotonic() - self._began)
        self._found = (observed_workers(result.final), result.final.desired_workers)
        if s.head_hw_tier is not None and result.final.head_hw_tier != s.head_hw_tier:
            backend.restart_head(self.ref, s.head_hw_tier, wait=True, timeout=max(deadline.remaining, 0.1))
        self._export_env(backend)
        check = ReadinessCheck(backend, self.ref, framework, default_reporter())
        readiness = check.change(result, deadline.remaining, needed=s.replicas)
        self.framework_check = readiness.proof
        # Ready means registered with the framework too: the summary's time to ready includes that wait.
        self._scaled = (*self._scaled[:2], time.monotonic() - self._began)
        reassert = None if backend.capabilities.holds_size else s.reassert_interval
        self._in_body = True
        self._monitor.watch(min(s.replicas, result.effective), reassert, s.sample_interval)

    @property
    def held_workers(self) -> Optional[int]:
        """Workers the cluster was held at for the body (the largest live claim), None before."""
        return self._scaled[1] if self._scaled is not None else None

    @property
    def workers_up(self) -> Optional[int]:
        """Workers up when the scale-up wait ended (at least :attr:`held_workers`), None before."""
        if self._found is None or self._scaled is None:
            return None
        return max(self._found[0], self._scaled[1])

    @property
    def faults(self) -> List[Fault]:
        """The faults seen during the body, in order (empty when none)."""
        return list(self._monitor.faults) if self._monitor is not None else []

    def _stop_body(self, fault: Fault) -> None:
        """Called by the monitor with ``fail_on_fault``: stop the body as a SIGTERM would, where the
        phase's handler is installed (else the phase fails once the body ends)."""
        if self._in_body and self._signals.guard.active:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)

    def _check_held_tier(self, backend: ClusterBackend, held: Claim) -> None:
        """Refuse a tier another phase's claim holds differently: a body must not run on a tier it did not
        ask for, nor re-tier the workers under another phase's body."""
        wanted = self.settings.worker_hw_tier
        if wanted is None:
            return
        if held.claim_id != self.claim_id and held.worker_hw_tier != wanted:
            other: Optional[Claim] = held
        else:
            other = next(
                (c for c in backend.claims(self.ref).values()
                 if c.claim_id != self.claim_id and c.worker_hw_tier not in (None, wanted)),
                None,
            )
        if other is None:
            return
        raise ConflictError(
            f"phase {self.claim_id} needs workers of tier {wanted!r}, but phase {other.claim_id} holds "
            f"{self.ref} with {other.replicas} workers of tier {other.worker_hw_tier or 'unspecified'!r}; "
            "overlapping phases must ask for the same worker tier",
            cluster=str(self.ref),
        )

    def _export_env(self, backend: ClusterBackend) -> None:
        # Domino injects these into runs; elsewhere the backend may offer them.
        try:
            variables = dict(backend.connection_env(self.ref))
        except ClusterNotFoundError:
            if self.claim is not None and self.claim.replicas > 0:
                raise
            # Nothing needed and nothing there (the local backend creates no head for 0 workers).
            logger.info("phase %s: %s does not exist and needs no workers; no connection variables", self.claim_id, self.ref)
            variables = {}
        self._env.enter_context(environ_set(variables))

    def _finish(self, error: Optional[BaseException]) -> None:
        with self._finish_lock:
            if self._finished:
                return
            self._finished = True
        self._in_body = False
        try:
            self._cleanup(error)
        finally:
            self._ended.set()

    def _cleanup(self, error: Optional[BaseException]) -> None:
        with self._signals.guard.deferred():
            if self._monitor is not None:
                self._monitor.stop()
                self._fault_failure(error)
            self._env.close()
            try:
                self._release()
                if isinstance(error, ScalingError) and self.restored_to is not None and self._gave_back:
                    given_back(error, self.restored_to)
            except Exception as exc:
                self.restore_error = exc
                self._report_restore_failure(exc, error)
            finally:
                self._close()
            emit_line(self._summary(self.fault_error or error))

    def _fault_failure(self, error: Optional[BaseException]) -> None:
        """With ``fail_on_fault`` and a fault seen: the :class:`ClusterFaultError` the phase raises
        (the body ended, or was stopped by the monitor's SIGTERM); a body error of its own is kept,
        with the fault noted on it."""
        failed = self._monitor.failed if self._monitor is not None else None
        if failed is None:
            return
        text = f"phase {self.claim_id} failed on a fault during its body (fail_on_fault): {failed.text()}"
        if error is None or isinstance(error, PhaseInterrupted):
            self.fault_error = ClusterFaultError(text, cluster=str(self.ref))
        elif hasattr(error, "add_note"):
            error.add_note(f"ddlscale: {text}")

    def _release(self) -> None:
        if not self._claimed or self._backend is None:
            return
        # After a scale-up that ran out of the phase's timeout, giving back is a clean-up with a bounded
        # grace of its own, not a second timeout: a hung head must not hold the phase twice as long.
        deadline = Deadline(CLEANUP_GRACE if self._start_timed_out else self.settings.timeout)
        with within(deadline, step=PROBE_GRACE if self._start_timed_out else None):
            backend, s = self._backend, self.settings
            remaining = backend.release(self.ref, self.claim_id)
            self._claimed = False
            pause_point("released")
            target = s.restore if isinstance(s.restore, ReplicaSpec) else None
            self.timeline.mark("restore")
            # While another phase holds the cluster, the workers it waits for are its own to wait for.
            needed = 0 if remaining is not None else None
            tier = self.claim.worker_hw_tier if self.claim else None
            result = backend.reconcile(
                self.ref, target, wait=True, timeout=max(deadline.remaining, MIN_WAIT),
                progress=recording(self.timeline, tier, None), needed=needed,
            )
            self._gave_back = result is not None
            if result is None:
                self.restored_to = "unchanged (no claim and no size outside phases recorded)"
                logger.debug("phase %s on %s ended; nothing left to restore", self.claim_id, self.ref)
                return
            if remaining is not None:
                # Informational only: reconcile itself decided from the claims live at its own time.
                self.restored_to = f"{plural(result.effective, 'worker')} (claim {remaining.claim_id} still live)"
            else:
                self.restored_to = f"{plural(result.effective, 'worker')} ({'given spec' if target else 'as found'})"
            # The removed workers gone from the framework too, so the next phase or flow starts from the restored size.
            framework = FrameworkOptions(s.framework_ready, s.framework_url)
            ReadinessCheck(backend, self.ref, framework).change(result, deadline.remaining, needed=needed)
            self.timeline.add(observed_workers(result.final), result.final.worker_hw_tier)
            # Debug only: the phase's summary line says how it ended.
            logger.debug("phase %s on %s ended; cluster set to %s", self.claim_id, self.ref, self.restored_to)

    def _summary(self, error: Optional[BaseException]) -> str:
        return PhaseEnd(
            self.label, str(self.ref), time.monotonic() - self._began, self._scaled, self.restored_to,
            error or self.restore_error, self.framework_check or "", self.body_failure, self._found,
            [fault.text() for fault in self.faults],
        ).line()

    def _report_restore_failure(self, exc: Exception, error: Optional[BaseException]) -> None:
        left = self._left_running(exc)
        if isinstance(exc, ScalingError):
            # Every surface that shows the restore's error (the note, `ddlscale run`'s last line) says it.
            exc.message += left
            exc.args = (exc.message,)
            left = ""
        logger.error("phase %s could not restore %s: %s%s", self.claim_id, self.ref, exc, left)
        if error is None:
            return
        note = f"ddlscale: restoring {self.ref} after this error also failed: {exc!r}{left}"
        if hasattr(error, "add_note"):
            error.add_note(note)
        setattr(error, "ddlscale_restore_error", exc)

    def _left_running(self, exc: Exception) -> str:
        """What a failed restore left running, as its error last saw it, and the command that stops it:
        nothing is left bigger without saying so."""
        state = getattr(exc, "state", None)
        seen = f" {state.describe()}" if state is not None else f" {self.ref} (its state unknown)"
        assert self._backend is not None
        return f"; left running:{seen}; to stop it: `{type(self._backend).stop_command(self.ref)}`"

    def _close(self) -> None:
        self.timeline.finish()
        if self.settings.deck:
            self._publish()
        if self._backend is not None:
            self._backend.close()

    def _publish(self) -> None:
        facts = {
            "cluster": str(self.ref),
            "backend": self._backend.name if self._backend is not None else "-",
            "phase": self.claim_id,
            "requested workers": self.settings.replicas,
            "held at (largest claim)": self.claim.replicas if self.claim else "-",
            "worker tier": self.settings.worker_hw_tier or "",
            "framework readiness": self.framework_check or "not checked",
            "autoscaler pull-backs re-asserted": self._monitor.pullbacks if self._monitor else 0,
            "faults during the body": "; ".join(f.text() for f in self.faults) or "none",
            "restored to": self.restored_to or "-",
            "restore error": repr(self.restore_error) if self.restore_error else "-",
            "seconds": f"{self.timeline.duration:.1f}",
        }
        try:
            self.publish(f"Distributed phase: {self.label}", self.timeline, facts)
        except Exception as exc:  # a Deck or Report is a report; it must never fail the phase
            logger.warning("could not attach the phase's page: %s", exc)


def _name_phase_timeout(error: ScalingTimeoutError, timeout: float, elapsed: float) -> None:
    """Say the phase's own timeout in ``error``: the backend saw only what the claim left of it."""
    prefix = f"the phase's timeout of {seconds(timeout)} ran out after {seconds(elapsed)}: "
    error.message = prefix + error.message
    error.args = (error.message,)
    if error.wait_message is not None:
        error.wait_message = prefix + error.wait_message
