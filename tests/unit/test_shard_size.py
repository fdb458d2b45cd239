"""[shares] shard_mib: one shard size used by the daemon's counts, gen-config, check-config,
the tag and the hook's bound."""

from __future__ import annotations

import pytest

from slurm_gpushare.admin.configcheck import Checker, SlurmConf
from slurm_gpushare.admin.genconfig import GpuNode, generate_fragments
from slurm_gpushare.core.config import ConfigError, parse_config, shards_per_gpu
from slurm_gpushare.core.policy import JobEstimate, decide
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.core.types import JobRequest
from slurm_gpushare.daemon.requeue import resize


def config(**shares):
    raw = {"policy": {"sharing_partitions": ["gpu"], "keep_whole_when_idle": False},
           "gpu_types": {"v100": {"memory_gib": 16}, "a100": {"memory_gib": 80}}}
    if shares:
        raw["shares"] = shares
    return parse_config(raw)


def share(cfg, memory_mib):
    estimate = JobEstimate(source="history", memory_mib={"v100": memory_mib, "a100": memory_mib},
                           detail="peak")
    return decide(JobRequest(uid=1000, partition="gpu", tres_per_node="gres:gpu:1"), cfg,
                  estimate=estimate, decision_id="d")


def test_default_is_one_gib_and_keeps_the_tag_as_it_was():
    cfg = config()
    assert cfg.shares.shard_mib == 1024
    assert [shards_per_gpu(g) for g in cfg.gpu_types] == [16, 80]
    decision = share(cfg, 5000)
    assert decision.writes["tres_per_node"] == "gres:shard:5"
    assert decision.writes["admin_comment"] == "gpushare:v1:share:id=d:shard=5:types=v100+a100:why=history-share"
    assert decision.share_gib == 5 and "5 GiB share (gres/shard)" in decision.reason


def test_half_gib_shards_count_and_tag_the_memory():
    cfg = config(shard_mib=512)
    assert [shards_per_gpu(g) for g in cfg.gpu_types] == [32, 160]
    assert cfg.hook_settings()["max_share_count"] == 160
    decision = share(cfg, 5000)  # ceil(5000 / 512) = 10 shards = 5 GiB; 4700 MiB -> 10 too
    assert decision.writes["tres_per_node"] == "gres:shard:10"
    tag = Tag.decode(decision.writes["admin_comment"])
    assert (tag.shard, tag.limit_mib) == (10, 5120.0)
    odd = share(cfg, 4500)  # 9 shards: 4.5 GiB, where 1 GiB shards would give 5
    assert odd.writes["tres_per_node"] == "gres:shard:9" and odd.share_gib == 4.5
    assert "4.5 GiB share (9 x 512 MiB gres/shard)" in odd.reason
    # A job needing the whole 16 GiB V100 still fits it: 32 shards.
    assert share(cfg, 16 * 1024).writes["tres_per_node"] == "gres:shard:32"


def test_requeue_resizes_in_the_sites_shards():
    cfg = config(shard_mib=512)
    tag = Tag("share", "history-share", "d", shard=10, mem_mib=5120, types=("v100",))
    new = resize(tag, peak_mib=6000, config=cfg)  # x 1.10 margin = 6600 MiB -> 13 shards
    assert new.tres_per_node == "gres:shard:13" and new.tag.limit_mib == 13 * 512


@pytest.mark.parametrize("value", [0, 32, 100000])
def test_out_of_range_or_bigger_than_a_gpu_is_an_error(value):
    with pytest.raises(ConfigError, match="shard_mib"):
        config(shard_mib=value)
    with pytest.raises(ConfigError, match="unknown key"):
        config(shard_gib=1)


def test_gen_config_and_check_config_use_the_setting(tmp_path):
    cfg = config(shard_mib=512)
    slurm, gres = generate_fragments([GpuNode("v1", "v100", 2), GpuNode("a1", "a100", 4)], cfg)
    assert "NodeName=v1 Gres=gpu:v100:2,shard:64" in slurm and "NodeName=v1 Name=shard Count=64" in gres
    assert "NodeName=a1 Name=shard Count=640" in gres and "512 MiB" in slurm

    def findings(slurm_text, gres_text, checked):
        (tmp_path / "slurm.conf").write_text(slurm_text)
        (tmp_path / "gres.conf").write_text(gres_text)
        checker = Checker(tmp_path / "slurm.conf", None, live=None)
        checker.config = checked
        checker.conf = SlurmConf.read(tmp_path / "slurm.conf")
        checker.check_nodes()
        return [f for f in checker.findings if f.check in ("shard-count", "gres-conf")]

    assert all(f.level == "ok" for f in findings(slurm, gres, cfg))
    # Files made for 1 GiB shards while the daemon counts 512 MiB ones: both disagree.
    old_slurm, old_gres = generate_fragments([GpuNode("v1", "v100", 2), GpuNode("a1", "a100", 4)],
                                             config())
    wrong = [f for f in findings(old_slurm, old_gres, cfg) if f.level == "error"]
    assert {f.check for f in wrong} == {"shard-count", "gres-conf"}
    assert any(f.message.endswith("(2 x 16 GiB v100, one shard per 512 MiB)") for f in wrong)


def test_explain_reads_the_shares_memory_from_the_tag():
    from slurm_gpushare.user.explain import decision_from_tag
    tag = Tag.decode(share(config(shard_mib=512), 4500).writes["admin_comment"])
    rebuilt = decision_from_tag(tag)
    assert rebuilt["share_gib"] == 4.5 and "4.5 GiB share (9 shards" in rebuilt["reason"]
    assert decision_from_tag(Tag("share", "history-share", "d", shard=5))["share_gib"] == 5
