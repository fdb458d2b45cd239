"""``python -m devcluster``: the development cluster and the demo (not part of the product)."""

from __future__ import annotations

import sys

import click

from devcluster.cluster import cluster_group
from devcluster.demo import demo_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Local heterogeneous Slurm cluster with the hook and daemon, and the demo on it."""


main.add_command(cluster_group)
main.add_command(demo_command)

if __name__ == "__main__":
    sys.exit(main())
