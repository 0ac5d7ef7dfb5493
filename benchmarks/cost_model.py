"""A model (not a measurement) of one workday's worker-hours under three scaling strategies.

The day has long idle stretches and two GPU phases of fixed work (45 minutes
on a full-size cluster). Three ways to run it:

* ``kept_at_max``: the cluster sits at ``max_workers`` GPU workers all day;
* ``cpu_heuristic``: Domino's autoscaling as the seeds describe it (HPA on
  80 % average CPU, +1 worker a minute, remove after 5 minutes of low use),
  starting from ``min_workers`` GPU workers (the HPA cannot change the tier,
  so the idle worker is a GPU worker);
* ``plugin``: ``@distributed_phase`` scales to ``max_workers`` GPU workers at
  the phase start, the phase runs once they are Ready, and the cluster goes
  back to one small-tier worker at the end.

Every new worker takes ``provision_minutes`` to join (a GPU node starting);
a worker is billed from the moment it is requested. A phase's work is done
at a rate of one unit per Ready GPU worker-minute, so a smaller cluster takes
longer. The heuristic model is generous to the HPA: a real HPA counts pods
that are not Ready yet as 0 % CPU and so waits for each new node before
adding the next one, which would make it slower than +1 a minute.
"""
import math
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

STRATEGIES = ("kept_at_max", "cpu_heuristic", "plugin")


@dataclass(frozen=True)
class Workday:
    """The scripted day and the cluster's limits (all times in minutes from 09:00)."""

    length_minutes: float = 540.0
    """09:00 to 18:00."""
    phases: Tuple[Tuple[float, float], ...] = ((90.0, 45.0), (330.0, 45.0))
    """(scheduled start, minutes of work at full size): 10:30 and 14:30."""
    max_workers: int = 8
    min_workers: int = 1
    provision_minutes: float = 4.0
    """Minutes from requesting a GPU worker to it being Ready (node start-up); an assumption."""
    busy_cpu: float = 0.9
    """Average CPU of a GPU worker while its phase has work (GPU jobs feeding data)."""
    idle_cpu: float = 0.05
    hpa_target: float = 0.8
    hpa_step_minutes: float = 1.0
    """The heuristic adds one worker per this many minutes."""
    hpa_scale_down_minutes: float = 5.0
    plugin_lag_seconds: float = 1.0
    """Seconds between the last worker Ready and the scale call returning (measured separately)."""
    step_minutes: float = 0.1


@dataclass
class Outcome:
    """What one strategy cost on the modelled day."""

    strategy: str
    gpu_worker_hours: float
    small_worker_hours: float
    minutes_to_full_size: List[Optional[float]]
    """Per phase: from the phase's start until ``max_workers`` GPU workers were Ready (None: never)."""
    phase_minutes: List[float]
    """Per phase: from its start until its work was done."""
    day_minutes: float
    """When the day's last work finished (at least the scheduled day length)."""
    times: List[float] = field(default_factory=list, repr=False)
    ready_gpu: List[int] = field(default_factory=list, repr=False)
    billed_gpu: List[int] = field(default_factory=list, repr=False)
    small: List[int] = field(default_factory=list, repr=False)


class _Pods:
    """GPU workers requested so far, by the minute they become Ready."""

    def __init__(self, ready_at: List[float]) -> None:
        self.ready_at = sorted(ready_at)

    def ready(self, now: float) -> int:
        return sum(1 for r in self.ready_at if r <= now)

    def resize(self, count: int, now: float, provision: float) -> None:
        while len(self.ready_at) < count:
            self.ready_at.append(now + provision)
        # Removing takes the newest (possibly not yet Ready) workers first.
        self.ready_at = sorted(self.ready_at)[:count]


def simulate(day: Workday, strategy: str) -> Outcome:
    """Run the modelled day under ``strategy`` and return its cost and timeline."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    dt = day.step_minutes
    initial = day.max_workers if strategy == "kept_at_max" else (day.min_workers if strategy == "cpu_heuristic" else 0)
    pods = _Pods([-1e9] * initial)
    small = 1 if strategy == "plugin" else 0
    outcome = Outcome(strategy, 0.0, 0.0, [], [], day.length_minutes)

    pending = list(day.phases)
    active: Optional[Dict[str, float]] = None
    last_up = -1e9
    low_since: Optional[float] = None
    tick = 0
    now = 0.0
    # Run past the scheduled day until every phase is done and the cluster has shrunk back.
    while now < day.length_minutes or pending or active is not None or (
        strategy == "cpu_heuristic" and len(pods.ready_at) > day.min_workers
    ):
        if active is None and pending and now >= pending[0][0]:
            start, minutes = pending.pop(0)
            active = {"start": now, "work": minutes * day.max_workers, "full_at": -1.0, "working": 0.0}
            if strategy == "plugin":
                pods.resize(day.max_workers, now, day.provision_minutes)
                small = 0
        ready = pods.ready(now)
        if active is not None:
            if active["full_at"] < 0 and ready >= day.max_workers:
                active["full_at"] = now
            # With the plugin the phase's tasks start when the scale call returns.
            can_work = strategy != "plugin" or (
                active["full_at"] >= 0 and now >= active["full_at"] + day.plugin_lag_seconds / 60.0
            )
            if can_work:
                active["work"] -= ready * dt
            if active["work"] <= 1e-9:
                full = active["full_at"]
                outcome.minutes_to_full_size.append(None if full < 0 else round(full - active["start"], 2))
                outcome.phase_minutes.append(round(now + dt - active["start"], 2))
                outcome.day_minutes = max(outcome.day_minutes, now + dt)
                active = None
                if strategy == "plugin":
                    pods.resize(0, now, day.provision_minutes)
                    small = 1
        if strategy == "cpu_heuristic":
            busy = active is not None
            cpu = day.busy_cpu if busy else day.idle_cpu
            if cpu >= day.hpa_target:
                low_since = None
                if len(pods.ready_at) < day.max_workers and now - last_up >= day.hpa_step_minutes:
                    pods.resize(len(pods.ready_at) + 1, now, day.provision_minutes)
                    last_up = now
            else:
                low_since = now if low_since is None else low_since
                if now - low_since >= day.hpa_scale_down_minutes:
                    desired = max(day.min_workers, math.ceil(pods.ready(now) * cpu / day.hpa_target))
                    pods.resize(min(desired, len(pods.ready_at)), now, day.provision_minutes)
        outcome.gpu_worker_hours += len(pods.ready_at) * dt / 60.0
        outcome.small_worker_hours += small * dt / 60.0
        outcome.times.append(round(now, 3))
        outcome.ready_gpu.append(pods.ready(now))
        outcome.billed_gpu.append(len(pods.ready_at))
        outcome.small.append(small)
        tick += 1
        # Integer ticks keep "one minute later" exact; summed floats drift.
        now = round(tick * dt, 6)
    outcome.gpu_worker_hours = round(outcome.gpu_worker_hours, 2)
    outcome.small_worker_hours = round(outcome.small_worker_hours, 2)
    return outcome


def compare(day: Workday) -> Dict[str, Outcome]:
    """Every strategy on the same ``day``."""
    return {name: simulate(day, name) for name in STRATEGIES}


def with_cpu(day: Workday, busy_cpu: float) -> Workday:
    """``day`` with a different CPU load while phases run (e.g. a CPU-light GPU job)."""
    return replace(day, busy_cpu=busy_cpu)
