"""The ``ddlscale`` command line: cluster commands and local-cluster management.

Exit codes, for scripts: 0 success, 2 bad input, 3 timeout, 4 not found,
5 unauthorized, 6 backend unavailable, 1 any other scaling error.
"""
import click

from .cluster_commands import register_cluster_commands
from .local_commands import local


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flytekitplugins-ddlscale")
def main() -> None:
    """Scale Domino distributed-compute clusters (Ray, Spark, Dask, MPI) on purpose."""


register_cluster_commands(main)
main.add_command(local)
