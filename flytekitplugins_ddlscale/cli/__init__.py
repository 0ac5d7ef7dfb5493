"""The ``ddlscale`` command line: cluster commands and local-cluster management.

Exit codes, for scripts: :data:`.output.EXIT_CODES_HELP` (printed once, by
``ddlscale --help``); ``ddlscale run`` passes its command's exit code through.
"""
import logging
from typing import Any

import click

from .._core.redaction import install_redaction
from .cluster_commands import register_cluster_commands
from .local_commands import local
from .output import EXIT_CODES_HELP, EXIT_INTERRUPTED
from .run_command import run


class _InterruptibleGroup(click.Group):
    """Exits 130 on Ctrl-C (click's own handling exits 1, which scripts read as a failure of the command)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("\nInterrupted.", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None


@click.group(
    cls=_InterruptibleGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP
)
@click.version_option(package_name="flytekitplugins-ddlscale")
@click.option("-v", "--verbose", is_flag=True, help="Log backend requests and retries (DEBUG).")
def main(verbose: bool) -> None:
    """Scale Domino distributed-compute clusters (Ray, Spark, Dask, MPI) on purpose."""
    install_redaction()
    _log_to_stderr(logging.DEBUG if verbose else logging.INFO)


def _log_to_stderr(level: int) -> None:
    # A Domino job's log is its stderr: progress and retries must show there
    # when no terminal is attached and the rich progress bar is off. Bare
    # lines, as a flow prints its summaries (the log adds its own timestamps).
    plugin_logger = logging.getLogger("flytekitplugins_ddlscale")
    if not any(getattr(h, "_ddlscale_cli", False) for h in plugin_logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._ddlscale_cli = True  # type: ignore[attr-defined]
        plugin_logger.addHandler(handler)
    plugin_logger.setLevel(level)


register_cluster_commands(main)
main.add_command(run)
main.add_command(local)
