"""``check-config`` and ``gen-config``: the admin's commands."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from slurm_gpushare.admin.configcheck import ProblemsFound, check_config, format_findings
from slurm_gpushare.admin.genconfig import generate_fragments, parse_node_spec, sinfo_gpu_nodes
from slurm_gpushare.core.config import ConfigError, load_config
from slurm_gpushare.core.hostlist import compress_hostlist


@click.command("check-config")
@click.option("--slurm-conf", type=click.Path(dir_okay=False),
              help="slurm.conf to check (default: the one slurmctld runs with, else $SLURM_CONF).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Daemon TOML (default: $GPUSHARE_CONFIG or /etc/slurm-gpushare/gpushare.toml).")
@click.option("--no-live", is_flag=True, help="Check the files only; do not ask slurmctld.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="List the checks that passed too.")
def check_config_command(slurm_conf, config_path, no_live, as_json, verbose) -> None:
    """Check everything sharing depends on; print each problem with its fix (exit 1 if any)."""
    findings = check_config(slurm_conf, config_path, live=not no_live)
    errors = sum(f.level == "error" for f in findings)
    if as_json:
        click.echo(json.dumps({"ok": errors == 0, "errors": errors,
                               "warnings": sum(f.level == "warning" for f in findings),
                               "findings": [asdict(f) for f in findings]}, indent=2))
    else:
        click.echo(format_findings(findings, verbose=verbose))
    if errors:
        raise ProblemsFound(f"check-config: {errors} problem(s) to fix (see above)")


# ---- gen-config ------------------------------------------------------------------------------

@click.command("gen-config")
@click.option("--nodes-from-sinfo", is_flag=True,
              help="Take the GPU nodes of the sharing partitions from sinfo.")
@click.option("--node", "node_specs", multiple=True, metavar="NAME:TYPE:COUNT",
              help="A GPU node (repeatable); NAME may be a hostlist such as gpu[01-04]. "
                   "With --nodes-from-sinfo: instead of what sinfo says of it.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Daemon TOML with [gpu_types] (default: $GPUSHARE_CONFIG or "
                   "/etc/slurm-gpushare/gpushare.toml).")
@click.option("--output-dir", "-o", type=click.Path(file_okay=False),
              help="Write slurm.conf.fragment and gres.conf.fragment there (default: stdout).")
def gen_config_command(nodes_from_sinfo, node_specs, config_path, output_dir) -> None:
    """Write the slurm.conf and gres.conf lines for GPU nodes (one shard per GiB)."""
    if not nodes_from_sinfo and not node_specs:
        raise click.UsageError("give --nodes-from-sinfo or --node NAME:TYPE:COUNT ... (or both)")
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    nodes = [node for spec in node_specs for node in parse_node_spec(spec)]
    if nodes_from_sinfo:
        partitions = config.policy.sharing_partitions
        found, outside = sinfo_gpu_nodes(partitions, {node.name for node in nodes})
        if outside:
            click.echo(f"gen-config: left out {compress_hostlist(outside)}: GPU nodes outside "
                       f"the sharing partitions ({', '.join(partitions)})", err=True)
        if not found and not nodes:
            raise click.ClickException("sinfo lists no GPU node in the sharing partitions "
                                       f"({', '.join(partitions)})")
        nodes = found + nodes
    slurm, gres = generate_fragments(nodes, config)
    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        for name, text in (("slurm.conf.fragment", slurm), ("gres.conf.fragment", gres)):
            (Path(output_dir) / name).write_text(text)
        click.echo(f"wrote {output_dir}/slurm.conf.fragment and {output_dir}/gres.conf.fragment")
    else:
        click.echo(f"{slurm}\n{gres}", nl=False)


commands = [check_config_command, gen_config_command]
