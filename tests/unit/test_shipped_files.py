"""The reference files under etc/ agree with each other: installed as shipped, the shard
counts of slurm.conf and gres.conf are what the daemon's configuration sizes shares by."""

from __future__ import annotations

import re
from pathlib import Path

from slurm_gpushare.core.config import load_config
from slurm_gpushare.core.hostlist import expand_hostlist

ETC = Path(__file__).resolve().parents[2] / "etc"


def test_the_fragments_shard_counts_follow_the_shipped_config():
    config = load_config(ETC / "gpushare.toml")
    slurm = (ETC / "slurm.conf.fragment").read_text()
    gres = (ETC / "gres.conf.fragment").read_text()
    checked = 0
    for nodes, gpu_type, gpus, shards in re.findall(
            r"^NodeName=(\S+) Gres=gpu:(\w+):(\d+),shard:(\d+)", slurm, re.M):
        per_gpu = config.gpu_type(gpu_type).memory_gib * 1024 // config.shares.shard_mib
        assert int(shards) == int(gpus) * per_gpu, (nodes, shards)
        assert f"NodeName={nodes} Name=shard Count={shards}" in gres
        checked += len(expand_hostlist(nodes))
    assert checked == 4
