"""Cost model benchmark: worker-hours and minutes-to-full-size of a scripted workday.

This is a model, not a measurement: see :mod:`benchmarks.cost_model` for its
assumptions. It runs the default day (CPU-busy GPU phases, favourable to the
CPU heuristic) and a CPU-light variant, and plots the worker counts.
"""
from pathlib import Path
from typing import Dict, List

from benchmarks.cost_model import STRATEGIES, Outcome, Workday, compare, with_cpu
from benchmarks.report import BenchResult
from benchmarks.stats import ratio

NAME = "cost_model"
TITLE = "Workday cost model (a model, not a measurement)"
PLOT = "cost_model.png"

LABELS = {
    "kept_at_max": "kept at max",
    "cpu_heuristic": "CPU heuristic (HPA 80 %, +1/min, 5 min to shrink)",
    "plugin": "phases scaled by this plugin",
}


def _row(outcome: Outcome, reference: Outcome) -> Dict[str, object]:
    return {
        "gpu_worker_hours": outcome.gpu_worker_hours,
        "small_worker_hours": outcome.small_worker_hours,
        "gpu_worker_hours_vs_kept_at_max": ratio(outcome.gpu_worker_hours, reference.gpu_worker_hours),
        "minutes_to_full_size": outcome.minutes_to_full_size,
        "phase_minutes": outcome.phase_minutes,
        "day_minutes": round(outcome.day_minutes, 1),
    }


def plot(outcomes: Dict[str, Outcome], day: Workday, path: Path) -> bool:
    """Draw GPU workers over the day per strategy; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(len(outcomes), 1, figsize=(10, 7), sharex=True, sharey=True)
    for ax, (name, out) in zip(axes, outcomes.items()):
        hours = [9 + t / 60.0 for t in out.times]
        ax.step(hours, out.billed_gpu, where="post", color="tab:red", label="GPU workers billed")
        ax.step(hours, out.ready_gpu, where="post", color="tab:blue", linestyle="--", label="GPU workers Ready")
        if any(out.small):
            ax.step(hours, out.small, where="post", color="tab:gray", label="small-tier workers")
        for start, minutes in day.phases:
            ax.axvspan(9 + start / 60.0, 9 + (start + minutes) / 60.0, color="tab:green", alpha=0.12)
        ax.set_title(f"{LABELS[name]}: {out.gpu_worker_hours:.1f} GPU worker-hours", fontsize=10)
        ax.set_ylabel("workers")
        ax.set_ylim(-0.3, day.max_workers + 1)
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    axes[0].legend(handles.values(), handles.keys(), loc="center right", fontsize=8)
    axes[-1].set_xlabel("time of day (h); green = scheduled 45-minute GPU phases")
    fig.suptitle("MODEL of one workday (assumptions in docs/benchmarks.md)", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run(quick: bool = False, out_dir: Path = Path("benchmarks/results")) -> BenchResult:
    """Simulate the day both ways (CPU-busy and CPU-light phases) and plot the first."""
    day = Workday()
    result = BenchResult(NAME, TITLE)
    scenarios: Dict[str, Dict[str, Dict[str, object]]] = {}
    outcomes_busy = compare(day)
    for label, scenario_day, outcomes in (
        (f"phases at {day.busy_cpu:.0%} CPU", day, outcomes_busy),
        ("CPU-light GPU phases at 50% CPU", with_cpu(day, 0.5), compare(with_cpu(day, 0.5))),
    ):
        reference = outcomes["kept_at_max"]
        scenarios[label] = {name: _row(outcomes[name], reference) for name in STRATEGIES}
    result.metrics["assumptions"] = {
        "day": "09:00-18:00; GPU phases scheduled 10:30 and 14:30, 45 min of work each at full size",
        "max_workers": day.max_workers,
        "min_workers_heuristic": day.min_workers,
        "plugin_idle": "1 small-tier worker between phases (tier switched by the scale call)",
        "provision_minutes": day.provision_minutes,
        "hpa": f"target {day.hpa_target:.0%} CPU, +1 worker per {day.hpa_step_minutes:g} min, "
        f"shrink after {day.hpa_scale_down_minutes:g} min low",
        "plugin_lag_seconds": day.plugin_lag_seconds,
        "billing": "a worker is billed from request to removal",
    }
    result.metrics["scenarios"] = scenarios
    busy = scenarios[f"phases at {day.busy_cpu:.0%} CPU"]
    headline: List[str] = [
        "MODEL: GPU worker-hours per day kept-at-max {k} / CPU heuristic {h} / plugin {p} "
        "(+{s} small-tier worker-hours); minutes to full size {mk} / {mh} / {mp}".format(
            k=busy["kept_at_max"]["gpu_worker_hours"],
            h=busy["cpu_heuristic"]["gpu_worker_hours"],
            p=busy["plugin"]["gpu_worker_hours"],
            s=busy["plugin"]["small_worker_hours"],
            mk=busy["kept_at_max"]["minutes_to_full_size"][0],
            mh=busy["cpu_heuristic"]["minutes_to_full_size"][0],
            mp=busy["plugin"]["minutes_to_full_size"][0],
        )
    ]
    light = scenarios["CPU-light GPU phases at 50% CPU"]["cpu_heuristic"]
    headline.append(
        f"MODEL, CPU-light GPU phases (50 % CPU): the CPU heuristic never grows; each phase takes "
        f"{light['phase_minutes'][0]:.0f} min instead of 45"
    )
    result.metrics["headline"] = headline
    result.notes.append(
        "A model, not a measurement: node start-up time, CPU load and billing are assumptions "
        "(see metrics.assumptions). With CPU-light phases the heuristic never reaches full size."
    )
    if plot(outcomes_busy, day, out_dir / PLOT):
        result.files.append(PLOT)
    else:
        result.notes.append("matplotlib not installed (pip install '.[bench]'): no plot")
    return result
