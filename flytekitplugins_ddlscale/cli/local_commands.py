"""``ddlscale local``: create, inspect and remove local clusters (Dask; Ray and Spark with their extras).

The local backend (and so Dask) is imported only when a command runs, so
``ddlscale --help`` stays fast.
"""
import json
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, TypeVar

import click

from ..errors import ClusterNotFoundError, ScalingError
from .._core.progress import default_reporter, plural
from ..refs import ClusterRef
from .output import emit_error

if TYPE_CHECKING:
    from ..backends.local import LocalBackend

T = TypeVar("T")


def _run(action: Callable[[], T]) -> T:
    try:
        return action()
    except ScalingError as error:
        sys.exit(emit_error(error, as_json=False))


def _backend(ctx: click.Context) -> "LocalBackend":
    from ..backends.local import LocalBackend
    from ..backends._support.privatefs import private_dir

    options: Dict[str, Any] = ctx.find_root().meta.get(_OPTIONS, {})
    state_dir = options.get("state_dir")

    def make() -> "LocalBackend":
        # The same folder as $DDLSCALE_STATE_DIR: its own checks first, so an unsafe one is named as given.
        local_dir = None if state_dir is None else private_dir(state_dir) / "local"
        return LocalBackend(state_dir=local_dir, tiers_file=options.get("tiers_file"))

    return _run(make)


_OPTIONS = "ddlscale.local"
"""Where the group's and the subcommands' --state-dir/--tiers-file are kept (a subcommand's wins)."""


def _remember(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> None:
    if value is not None:
        ctx.find_root().meta.setdefault(_OPTIONS, {})[param.name] = value


def _shared_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--state-dir`` and ``--tiers-file``, accepted on ``ddlscale local`` and on each of its commands."""
    command = click.option(
        "--tiers-file", type=click.Path(dir_okay=False), default=None, expose_value=False, callback=_remember,
        help="Tiers YAML (default: $DDLSCALE_LOCAL_TIERS or the packaged Small/Medium/Large).",
    )(command)
    return click.option(
        "--state-dir", type=click.Path(file_okay=False), default=None, expose_value=False, callback=_remember,
        help="The state directory, as $DDLSCALE_STATE_DIR (default: that, else ~/.ddlscale); "
        "local clusters are recorded in its 'local' folder.",
    )(command)


def _ref(backend: "LocalBackend", kind: str, name: str) -> ClusterRef:
    """The cluster named, after refusing a kind the local backend does not run: the same
    ``[invalid_input]`` error and exit code 2 as ``ddlscale scale --backend local`` gives."""
    ref = _run(lambda: ClusterRef(kind, name))
    _run(lambda: backend.check_kind(ref))
    return ref


_kind_option = click.option(
    "--kind", default="dask", show_default=True,
    help="Cluster kind: dask, ray or spark, any case (ray and spark need their extras).",
)


def _summary(info: Dict[str, Any]) -> str:
    env = info["env"]
    return (
        f"{info['cluster']} {info['status']}: workers {info['ready_workers']}/{info['desired_workers']} "
        f"ready ({info['existing_workers']} running), tier {info['worker_hw_tier']}, "
        f"scheduler {info['address']}\n"
        f"  export {' '.join(f'{k}={v}' for k, v in sorted(env.items()))}"
        + (f"\n  {_dead_note(info)}" if info.get("dead_claims") else "")
    )


def _dead_note(info: Dict[str, Any]) -> str:
    """``4 workers, 3 held by a run that is gone since ...``: what dead claims still on record hold."""
    return (f"{plural(info['desired_workers'], 'worker')}, {', '.join(info['dead_claims'])}; the next command "
            "on it or `ddlscale status` gives them back")


@click.group("local")
@_shared_options
def local() -> None:
    """Local clusters: a head and worker processes on this machine (Dask; Ray and Spark with their extras)."""


@local.command("up")
@_shared_options
@_kind_option
@click.option("--name", required=True, help="Cluster name (DNS-1123 label).")
@click.option("--replicas", type=int, default=None, help="Number of worker processes.  [default: 1]")
@click.option("--worker-hw-tier", default=None, help="Worker tier NAME (default: the tiers file's first tier).")
# The older names still work; help lists each option once.
@click.option("--workers", "workers_alias", type=int, default=None, hidden=True)
@click.option("--tier", "tier_alias", default=None, hidden=True)
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds to wait for the workers.")
@click.option("--json", "as_json", is_flag=True, help="Print the cluster as JSON.")
@click.pass_context
def up(ctx: click.Context, kind: str, name: str, timeout: float, as_json: bool, **size: Any) -> None:
    """Create a cluster (or resize it) and wait until the scheduler sees its workers."""
    # ``size``: --replicas and --worker-hw-tier, each also given by its older name (not both).
    workers = _one_of("--replicas", size["replicas"], "--workers", size["workers_alias"], default=1)
    tier = _one_of("--worker-hw-tier", size["worker_hw_tier"], "--tier", size["tier_alias"], default=None)
    backend = _backend(ctx)
    ref = _ref(backend, kind, name)
    with default_reporter() as progress:
        _run(lambda: backend.up(ref, workers, tier, timeout=timeout, progress=progress))
    info = _run(lambda: backend.describe(ref))
    click.echo(json.dumps(info, indent=2) if as_json else _summary(info))


def _one_of(name: str, value: Optional[T], alias: str, alias_value: Optional[T], default: T) -> T:
    """The value of an option given by its name or its older alias (not both), else ``default``."""
    if value is not None and alias_value is not None:
        raise click.UsageError(f"give {name} or its older name {alias}, not both")
    if value is not None:
        return value
    return alias_value if alias_value is not None else default


@local.command("down")
@_shared_options
@_kind_option
@click.option("--name", default=None, help="Cluster to stop.")
@click.option("--all", "everything", is_flag=True, help="Stop every local cluster.")
@click.pass_context
def down(ctx: click.Context, kind: str, name: Optional[str], everything: bool) -> None:
    """Stop a cluster's processes and forget it."""
    if bool(name) == everything:
        raise click.UsageError("give exactly one of --name NAME or --all")
    backend = _backend(ctx)
    if everything:
        failures: List[ScalingError] = []
        stopped = _run(lambda: backend.shutdown_all(failures))
        click.echo(f"stopped {plural(len(stopped), 'cluster')}" + "".join(f"\n  {r}" for r in stopped))
        for failure in failures:
            code = emit_error(failure, as_json=False)
        if failures:
            sys.exit(code)
        return
    ref = _ref(backend, kind, name or "")
    taken = _run(lambda: backend.take_down(ref))
    if taken is None:
        sys.exit(emit_error(ClusterNotFoundError(f"no local cluster {ref}", cluster=str(ref)), as_json=False))
    found = f"{plural(len(taken.recorded), 'recorded process', 'recorded processes')} running"
    if taken.unrecorded:
        found += f", and {plural(len(taken.unrecorded), 'process', 'processes')} its record did not hold " \
                 f"(pids {', '.join(map(str, taken.unrecorded))})"
    click.echo(f"stopped {ref}: found {found}")


@local.command("status")
@_shared_options
@_kind_option
@click.option("--name", required=True, help="Cluster to report.")
@click.option("--json", "as_json", is_flag=True, help="Print the cluster as JSON.")
@click.option(
    "--repair/--no-repair", default=False, show_default=True,
    help="Restart a dead scheduler or missing workers (up to the recorded size) before reporting; "
    "without it nothing is started or stopped.",
)
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds a repair may wait.")
@click.pass_context
def status(ctx: click.Context, kind: str, name: str, as_json: bool, repair: bool, timeout: float) -> None:
    """Report a cluster: processes, the workers its scheduler sees, connection variables. Only
    reports; with --repair it first restarts what died."""
    backend = _backend(ctx)
    ref = _ref(backend, kind, name)
    info = _run(lambda: backend.describe(ref))
    repaired = False
    if repair and info["status"] != "Running":
        with default_reporter() as progress:
            _run(lambda: backend.repair(ref, timeout=timeout, progress=progress))
        info, repaired = _run(lambda: backend.describe(ref)), True
    info["repaired"] = repaired
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(_summary(info) + ("\n  (repaired: restarted missing processes)" if repaired else ""))


@local.command("list")
@_shared_options
@click.option("--json", "as_json", is_flag=True, help="Print the clusters as JSON.")
@click.pass_context
def list_clusters(ctx: click.Context, as_json: bool) -> None:
    """List local clusters with their status (no repair); a cluster whose record is corrupt is listed as
    Corrupt, one whose processes run without a record as Unrecorded (`down` stops both)."""
    backend = _backend(ctx)
    infos = _run(backend.survey)
    if as_json:
        click.echo(json.dumps(infos, indent=2))
    elif not infos:
        click.echo("no local clusters")
    else:
        click.echo(_table(infos))


def _table(infos: List[Dict[str, Any]]) -> str:
    """One aligned row per cluster under a header; every column as wide as its widest cell. A NOTE
    column says what is wrong (corrupt record, unrecorded processes, interrupted change) when anything is."""
    notes = [_problems(info) for info in infos]
    noted = any(notes)
    rows = [("KIND", "NAME", "STATUS", "READY/DESIRED", "TIER", "SCHEDULER") + (("NOTE",) if noted else ())] + [
        (
            info["kind"], info["name"], info["status"],
            "-" if info["desired_workers"] is None else f"{info['ready_workers']}/{info['desired_workers']}",
            info["worker_hw_tier"] or "-", info["address"] or "-",
        ) + ((note,) if noted else ())
        for info, note in zip(infos, notes)
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def _problems(info: Dict[str, Any]) -> str:
    """What is wrong with a listed cluster: its record's error, processes it does not hold, an
    interrupted change."""
    notes = []
    if info.get("error"):
        notes.append(info["error"])
    if info.get("unrecorded_pids"):
        notes.append(f"{plural(len(info['unrecorded_pids']), 'process', 'processes')} not recorded "
                     f"(pids {', '.join(map(str, info['unrecorded_pids']))}); `ddlscale local down` stops them")
    if info.get("dead_claims"):
        notes.append(_dead_note(info))
    if info.get("pending") and info["status"] == "Interrupted":
        notes.append(f"a change to {info['pending']['desired']} workers was interrupted; set the size with "
                     f"`ddlscale local up` or take it down")
    return "; ".join(notes)
