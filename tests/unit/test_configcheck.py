"""check-config and gen-config: Slurm's files read as Slurm reads them, the live cluster
checked clean, a deliberately broken copy of its configuration found out -- and the printed
fixes, applied as printed, make it clean again."""

from __future__ import annotations

from pathlib import Path


from slurm_gpushare.cli import main
from slurm_gpushare.core.config import parse_config
from slurm_gpushare.admin.genconfig import GpuNode, generate_fragments
from slurm_gpushare.core.hostlist import compress_hostlist, expand_hostlist
from slurm_gpushare.admin.configcheck import (Checker, SlurmConf, gres_conf_units,
                                        gres_tokens)

REPO = Path(__file__).resolve().parents[2]
CONFIG = parse_config({"gpu_types": {"v100": {"memory_gib": 16}, "a100": {"memory_gib": 80}},
                       "policy": {"sharing_partitions": ["gpu"]}})


# ---- reading Slurm's files -------------------------------------------------------------------------

def test_hostlists_expand_and_compress():
    assert expand_hostlist("gpu-[01-03,07],login1") == ["gpu-01", "gpu-02", "gpu-03", "gpu-07",
                                                        "login1"]
    assert compress_hostlist(["gpu-01", "gpu-02", "gpu-03", "gpu-07", "login1", "head"]) == \
        "head,gpu-[01-03,07],login1"
    assert expand_hostlist(compress_hostlist(["n9", "n10", "n11"])) == ["n9", "n10", "n11"]


def test_slurm_conf_reading_follows_slurms_rules(tmp_path):
    (tmp_path / "nodes.conf").write_text("NodeName=DEFAULT Features=fast\n"
                                         "NodeName=g[1-2] Gres=gpu:a100:4,shard:320 \\\n"
                                         "   CPUs=64  # trailing comment\n")
    (tmp_path / "slurm.conf").write_text("# header\ngrestypes=gpu,shard\nInclude nodes.conf\n"
                                         "PartitionName=gpu Nodes=g[1-2]\n")
    conf = SlurmConf.read(tmp_path / "slurm.conf")
    assert conf.get("GresTypes") == "gpu,shard"
    assert set(conf.nodes) == {"g1", "g2"} and conf.nodes["g2"]["cpus"] == "64"
    assert conf.nodes["g1"]["features"] == "fast" and "gpu" in conf.partitions


def test_gres_strings_and_gres_conf_counts(tmp_path):
    assert gres_tokens("gpu:v100:2(S:0-1),shard:v100:32") == [("gpu", "v100", 2),
                                                              ("shard", "v100", 32)]
    assert gres_tokens("(null)") == [] and gres_tokens("gpu:4") == [("gpu", None, 4)]
    (tmp_path / "gres.conf").write_text("NodeName=g[1-2] Name=shard Count=160\n"
                                        "NodeName=g1 Name=shard Count=2\nName=shard Count=1\n")
    assert gres_conf_units(tmp_path / "gres.conf", ["g1", "g2", "g3"])["shard"] == {
        "g1": 163, "g2": 161, "g3": 1}


def test_missing_lua_modules_are_an_error_with_the_package_fix(tmp_path):
    checker = Checker(tmp_path / "slurm.conf", None, live=None, lua_binary="",
                      lua_dirs=[str(tmp_path)])
    checker.check_lua()
    finding = checker.findings[-1]
    assert finding.level == "error" and "socket/unix.so, cjson.so" in finding.message
    assert finding.fix.startswith("apt-get install lua-socket lua-cjson")
    (tmp_path / "socket").mkdir()
    (tmp_path / "socket" / "unix.so").touch()
    (tmp_path / "cjson.so").touch()
    checker.check_lua()
    assert checker.findings[-1].level == "ok"


def test_generated_fragments_pass_the_checks(tmp_path):
    nodes = [GpuNode(f"gpu{i:02d}", "a100", 4, ("ib",)) for i in range(1, 5)]
    nodes.append(GpuNode("old1", "v100", 2))
    slurm, gres = generate_fragments(nodes, CONFIG)
    assert "NodeName=gpu[01-04] Gres=gpu:a100:4,shard:320 Features=ib,a100" in slurm
    assert "NodeName=old1 Name=shard Count=32" in gres
    (tmp_path / "slurm.conf").write_text(slurm + "PartitionName=gpu Nodes=ALL\n")
    (tmp_path / "gres.conf").write_text(gres)
    checker = Checker(tmp_path / "slurm.conf", None, live=None)
    checker.config = CONFIG
    checker.conf = SlurmConf.read(tmp_path / "slurm.conf")
    checker.check_slurm_params()
    checker.check_nodes()
    assert [f for f in checker.findings if f.level != "ok"] == []


def test_mps_types_are_generated_and_accounted(tmp_path):
    config = parse_config({"gpu_types": {"a100": {"memory_gib": 80},
                                         "t4": {"memory_gib": 16, "sharing": "mps"}},
                           "policy": {"sharing_partitions": ["gpu"]}})
    slurm, gres = generate_fragments([GpuNode("a1", "a100", 2), GpuNode("t1", "t4", 2)], config)
    assert "GresTypes=gpu,shard,mps" in slurm
    assert "AccountingStorageTRES=gres/gpu,gres/shard,gres/mps" in slurm
    assert "NodeName=t1 Gres=gpu:t4:2,mps:200" in slurm and "NodeName=t1 Name=mps Count=200" in gres

    def accounting(line):
        (tmp_path / "slurm.conf").write_text(slurm.replace(
            "AccountingStorageTRES=gres/gpu,gres/shard,gres/mps", line))
        checker = Checker(tmp_path / "slurm.conf", None, live=None)
        checker.config = config
        checker.conf = SlurmConf.read(tmp_path / "slurm.conf")
        checker.check_slurm_params()
        return next(f for f in checker.findings if f.check == "accounting-tres")

    assert accounting("AccountingStorageTRES=gres/gpu,gres/shard,gres/mps").level == "ok"
    # MPS shares carry no gres/gpu: unaccounted, they vanish from AllocTRES.
    missing = accounting("AccountingStorageTRES=gres/gpu,gres/shard")
    assert missing.level == "error" and "lacks gres/mps" in missing.message
    assert missing.fix.endswith("AccountingStorageTRES=gres/gpu,gres/shard,gres/mps")


def test_gen_config_for_given_nodes_and_its_errors(tmp_path, capsys):
    toml = tmp_path / "gpushare.toml"
    toml.write_text("[gpu_types.a100]\nmemory_gib = 80\n")
    assert main(["gen-config", "--config", str(toml), "--node", "gpu[01-04]:a100:4"]) == 0
    out = capsys.readouterr().out
    assert "NodeName=gpu[01-04] Gres=gpu:a100:4,shard:320 Features=a100" in out
    assert "NodeName=gpu[01-04] Name=gpu Type=a100 File=/dev/nvidia[0-3]" in out
    assert main(["gen-config", "--config", str(toml), "--node", "n1:h100:8"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[gpu_types.h100]" in err
    assert main(["gen-config", "--config", str(toml), "--node", "n1-a100-8"]) == 1
    assert "NAME:TYPE:COUNT" in capsys.readouterr().err


# ---- the Slurm version's traps -------------------------------------------------------------------

def _version_findings(tmp_path, version, *, gres_conf="AutoDetect=off\n",
                      tres="gres/gpu,gres/shard"):
    from slurm_gpushare.admin.configcheck import LiveSlurm

    (tmp_path / "slurm.conf").write_text(f"GresTypes=gpu,shard\nAccountingStorageTRES={tres}\n")
    (tmp_path / "gres.conf").write_text(gres_conf)
    live = LiveSlurm(config={"slurm_version": version})
    checker = Checker(tmp_path / "slurm.conf", None, live=live)
    checker.conf = SlurmConf.read(tmp_path / "slurm.conf")
    checker.check_slurm_version()
    return [(f.level, f.message) for f in checker.findings]


def test_the_whole_gpu_and_shard_bug_is_named_up_to_23_11_4(tmp_path):
    for version in ("22.05.8", "23.02.7", "23.11.4"):
        warnings = [m for level, m in _version_findings(tmp_path, version) if level == "warning"]
        assert len(warnings) == 1 and "fixed in 23.11.5" in warnings[0], version
        assert "bug 19110" in warnings[0]
    for version in ("23.11.5", "24.11.5"):
        assert all(level == "ok" for level, _ in _version_findings(tmp_path, version)), version


def test_gpu_usage_accounting_is_asked_for_where_nvml_can_give_it(tmp_path):
    nvml = "AutoDetect=nvml\n"
    found = _version_findings(tmp_path, "24.11.5", gres_conf=nvml)
    assert [m for level, m in found if level == "warning"] == [
        m for _, m in found if "lacks gres/gpumem, gres/gpuutil" in m]
    assert len(found) == 2
    # 22.05 cannot account it; with the TRES listed there is nothing to say.
    assert not any("gpumem" in m for _, m in _version_findings(tmp_path, "22.05.8", gres_conf=nvml))
    assert all(level == "ok" for level, _ in _version_findings(
        tmp_path, "24.11.5", gres_conf=nvml, tres="gres/gpu,gres/shard,gres/gpumem,gres/gpuutil"))


def test_versions_older_than_shards_are_an_error(tmp_path):
    assert _version_findings(tmp_path, "21.08.8")[0][0] == "error"


# ---- the SJF lever against the site's priority weights ----------------------------------------

def _priority_findings(tmp_path, conf_lines: str, **policy):
    (tmp_path / "slurm.conf").write_text(conf_lines)
    checker = Checker(tmp_path / "slurm.conf", None, live=None)
    checker.conf = SlurmConf.read(tmp_path / "slurm.conf")
    checker.config = parse_config({"gpu_types": {"v100": {"memory_gib": 16}},
                                   "policy": {"sharing_partitions": ["gpu"], **policy}})
    checker.check_priority()
    return [f for f in checker.findings if f.check == "priority"]


def test_priority_is_not_checked_without_the_sjf_lever(tmp_path):
    assert _priority_findings(tmp_path, "PriorityType=priority/basic\n") == []


def test_sjf_lever_wants_multifactor(tmp_path):
    [finding] = _priority_findings(tmp_path, "ClusterName=x\n", priority="sjf")
    assert finding.level == "warning" and "PriorityType=priority/basic" in finding.message
    assert finding.fix.endswith("set: PriorityType=priority/multifactor")


def test_sjf_penalties_that_would_clamp_at_one_are_named_with_a_base_to_add(tmp_path):
    conf = ("PriorityType=priority/multifactor\nPriorityWeightAge=1000\n"
            "PriorityWeightFairshare=10000\n")
    [finding] = _priority_findings(tmp_path, conf, priority="sjf", sjf_nice_max=20000)
    assert finding.level == "warning" and "add up to 11000" in finding.message
    assert "PriorityWeightPartition=31000" in finding.fix and "sjf_nice_max" in finding.fix
    # The printed fix, applied, clears it.
    fixed = _priority_findings(tmp_path, conf + "PriorityWeightPartition=31000\n",
                               priority="sjf", sjf_nice_max=20000)
    assert [f.level for f in fixed] == ["ok"]


def test_sjf_exchange_rate_against_age_is_stated(tmp_path):
    base = "PriorityType=priority/multifactor\nPriorityWeightPartition=100000\n"
    [mild] = _priority_findings(tmp_path, base + "PriorityWeightAge=1000\nPriorityMaxAge=7-0\n",
                                priority="sjf", sjf_nice_per_decade=500, sjf_nice_max=2000)
    assert mild.level == "ok" and "catches up with it after 3.5 days" in mild.message
    [strong] = _priority_findings(tmp_path, base + "PriorityWeightAge=1000\n", priority="sjf",
                                  sjf_nice_per_decade=5000, sjf_nice_max=20000)
    assert strong.level == "ok" and "never makes up one decade" in strong.message
    [none] = _priority_findings(tmp_path, base, priority="sjf", sjf_nice_max=2000)
    assert none.level == "warning" and "PriorityWeightAge=0" in none.message


def test_slurm_durations():
    from slurm_gpushare.admin.configcheck import _duration_s
    assert _duration_s("7-0") == 7 * 86400
    assert _duration_s("7-00:00:00") == 7 * 86400
    assert _duration_s("1-2:30") == 86400 + 2 * 3600 + 1800
    assert _duration_s("90") == 5400 and _duration_s("1:30") == 90
    assert _duration_s("2:00:00") == 7200 and _duration_s("soon") is None


def test_an_unreadable_max_age_is_named_not_read_as_never(tmp_path):
    conf = ("PriorityType=priority/multifactor\nPriorityWeightPartition=100000\n"
            "PriorityWeightAge=1000\nPriorityMaxAge=soon\n")
    [finding] = _priority_findings(tmp_path, conf, priority="sjf", sjf_nice_per_decade=500,
                                   sjf_nice_max=2000)
    assert finding.level == "warning" and "PriorityMaxAge=soon" in finding.message
    assert "never" not in finding.message


def test_a_gpu_type_the_catalogue_lacks_is_a_warning_with_the_fix(tmp_path):
    (tmp_path / "slurm.conf").write_text("ClusterName=c\n")
    config = tmp_path / "gpushare.toml"
    config.write_text('[gpu_types.b200]\nmemory_gib = 180\n'
                      '[gpu_types.a100]\nmemory_gib = 80\nmodel = "A100-80GB"\n'
                      '[gpu_types.v100]\nmemory_gib = 16\n')
    checker = Checker(tmp_path / "slurm.conf", str(config), live=None)
    checker.read_inputs()
    found = [f for f in checker.findings if f.check == "gpu-types"]
    assert [f.level for f in found] == ["warning"] and "'b200'" in found[0].message
    assert 'model = "<that model>"' in found[0].fix
