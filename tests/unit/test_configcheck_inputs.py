"""check-config and gen-config on configurations as sites write them: Slurm's own syntax
(spaces around '=', Include with %c, one GPU type on several sockets), GPU nodes outside the
sharing partitions, and files Slurm refuses (each an error naming its file and line, the rest
still checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpushare.admin import genconfig
from slurm_gpushare.admin.configcheck import Checker, Finding, SlurmConf
from slurm_gpushare.core.config import parse_config
from slurm_gpushare.cli import main

PARAMS = ("ClusterName=test\nGresTypes=gpu,shard\nSelectType=select/cons_tres\n"
          "JobSubmitPlugins=lua\nAccountingStorageTRES=gres/gpu,gres/shard\n"
          "Prolog=/etc/slurm/prolog\nEpilog=/etc/slurm/epilog\n")
NODES = ("NodeName=gpu[01-02] Gres=gpu:v100:4,shard:64 Features=v100 CPUs=32\n"
         "NodeName=gpu[03-04] Gres=gpu:a100:4,shard:320 Features=a100 CPUs=64\n"
         "PartitionName=gpu Nodes=gpu[01-04] Default=YES\n")
GRES = ("NodeName=gpu[01-02] Name=gpu Type=v100 File=/dev/nvidia[0-3]\n"
        "NodeName=gpu[01-02] Name=shard Count=64\n"
        "NodeName=gpu[03-04] Name=gpu Type=a100 File=/dev/nvidia[0-3]\n"
        "NodeName=gpu[03-04] Name=shard Count=320\n")
# Checks that depend on this host (daemon, Lua, hook files, scontrol), not on the files.
HOST = {"daemon", "daemon-peer", "query-socket", "lua-modules", "hook-files", "hook-settings",
        "slurm-version", "gpu-types"}


def check(tmp_path: Path, slurm: str = PARAMS + NODES, gres: str | None = GRES) -> list[Finding]:
    (tmp_path / "slurm.conf").write_text(slurm)
    if gres is not None:
        (tmp_path / "gres.conf").write_text(gres)
    (tmp_path / "gpushare.toml").write_text(
        f'[daemon]\nsocket = "{tmp_path}/none.sock"\nquery_socket = ""\n'
        '[policy]\nsharing_partitions = ["gpu"]\n'
        '[gpu_types.v100]\nmemory_gib = 16\n[gpu_types.a100]\nmemory_gib = 80\n')
    checker = Checker(tmp_path / "slurm.conf", str(tmp_path / "gpushare.toml"), live=None,
                      lua_binary="", lua_dirs=[])
    return [f for f in checker.run() if f.check not in HOST]


def problems(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.level, f.message) for f in findings if f.level != "ok"]


def test_the_base_configuration_is_clean(tmp_path):
    assert problems(check(tmp_path)) == []


# ---- 1. spaces around '=' ----------------------------------------------------------------------

def test_spaces_around_the_equals_sign_are_read_as_slurm_reads_them(tmp_path):
    slurm = PARAMS.replace("=", " = ") + NODES.replace("Gres=", "Gres = ")
    gres = GRES.replace("Count=", "Count = ").replace("NodeName=", "NodeName =")
    assert problems(check(tmp_path, slurm, gres)) == []
    # ... and a wrong count behind such spaces is still found.
    found = problems(check(tmp_path, slurm, gres.replace("Count = 64", "Count = 60")))
    assert [m for _, m in found] == ["gres.conf gives gpu01 60 shards; 64 expected (GPUs x GiB)",
                                     "gres.conf gives gpu02 60 shards; 64 expected (GPUs x GiB)"]


# ---- 2. GPU nodes outside the sharing partitions -----------------------------------------------

OUTSIDE = ("NodeName=old[01-08] Gres=gpu:2 CPUs=16\n"
           "NodeName=viz[01-02] Gres=gpu:rtx6000:1 CPUs=16 Features=viz\n"
           "PartitionName=legacy Nodes=old[01-08]\nPartitionName=viz Nodes=viz[01-02]\n")


def test_gpu_nodes_outside_the_sharing_partitions_are_left_alone(tmp_path):
    found = check(tmp_path, PARAMS + NODES + OUTSIDE,
                  GRES + "NodeName=old[01-08] Name=gpu File=/dev/nvidia[0-1]\n")
    assert problems(found) == []
    assert any(f.level == "ok" and "old[01-08],viz[01-02]" in f.message
               and "outside the sharing partitions" in f.message for f in found)


def test_a_node_also_in_a_sharing_partition_is_checked(tmp_path):
    slurm = PARAMS + NODES + OUTSIDE + "PartitionName=more Nodes=old01\n" \
        "PartitionName=gpu2 Nodes=viz01\n"
    found = problems(check(tmp_path, slurm.replace(
        "PartitionName=gpu Nodes=gpu[01-04]", "PartitionName=gpu Nodes=gpu[01-04],old02")))
    assert found == [
        ("error", "old02 declares untyped GPUs (gpu:2): shares are placed by GPU type")]


@pytest.mark.parametrize("partition", [
    "PartitionName=gpu Nodes=ALL",
    "NodeSet=oldies Nodes=old[01-08]\nPartitionName=gpu Nodes=gpu[01-04],oldies",
    "NodeSet=oldies Feature=viz\nPartitionName=gpu Nodes=gpu[01-04],oldies",
    "PartitionName=DEFAULT Nodes=ALL\nPartitionName=gpu",
])
def test_all_nodesets_and_defaults_name_partition_members(tmp_path, partition):
    slurm = PARAMS + NODES.replace("PartitionName=gpu Nodes=gpu[01-04] Default=YES", partition) \
        + OUTSIDE.replace("PartitionName", "#")
    found = [m for _, m in problems(check(tmp_path, slurm))]
    assert any("old01 declares untyped GPUs" in m for m in found) or \
        any("viz01's GPU type rtx6000" in m for m in found), found


def test_the_running_nodes_partitions_count_for_slurmctld(tmp_path):
    from slurm_gpushare.admin.configcheck import LiveSlurm

    (tmp_path / "slurm.conf").write_text(PARAMS + NODES)
    live = LiveSlurm(config={"grestypes": "gpu,shard"}, nodes={
        "old01": {"Gres": "gpu:2", "Partitions": "legacy"},
        "old02": {"Gres": "gpu:2", "Partitions": "legacy,gpu"}})
    checker = Checker(tmp_path / "slurm.conf", None, live=live)
    checker.config = parse_config({"gpu_types": {"a100": {"memory_gib": 80}},
                                   "policy": {"sharing_partitions": ["gpu"]}})
    checker.conf = SlurmConf.read(tmp_path / "slurm.conf")
    checker.check_nodes()
    found = [(f.level, f.message) for f in checker.findings if f.where == "slurmctld"]
    assert found == [("error", "old02 declares untyped GPUs (gpu:2): shares are placed by "
                      "GPU type"),
                     ("ok", "old01: GPU nodes outside the sharing partitions, left alone "
                      "(slurmctld)")]


def test_no_gpu_node_in_the_sharing_partitions_is_a_warning(tmp_path):
    slurm = PARAMS + NODES.replace("PartitionName=gpu", "PartitionName=x")
    found = problems(check(tmp_path, slurm))
    assert ("warning", "no GPU node is in the sharing partitions (gpu): nothing to share") in found


SINFO = ("gpu01|gpu:a100:4|a100|gpu*\ngpu01|gpu:a100:4|a100|legacy\n"
         "old01|gpu:2|(null)|legacy\nviz01|gpu:rtx6000:1|viz|viz\nlogin1|(null)|(null)|gpu*\n")


def sinfo(monkeypatch, text):
    monkeypatch.setattr(genconfig.cmd, "check_output", lambda argv, **kw: text)


@pytest.fixture
def toml(tmp_path) -> Path:
    path = tmp_path / "gpushare.toml"
    path.write_text('[policy]\nsharing_partitions = ["gpu"]\n[gpu_types.a100]\nmemory_gib = 80\n')
    return path


def test_gen_config_skips_gpu_nodes_outside_the_sharing_partitions(monkeypatch, toml, capsys):
    sinfo(monkeypatch, SINFO)
    assert main(["gen-config", "--nodes-from-sinfo", "--config", str(toml)]) == 0
    out, err = capsys.readouterr()
    assert "NodeName=gpu01 Gres=gpu:a100:4,shard:320 Features=a100" in out
    assert "old01" not in out and "viz01" not in out
    assert "old01,viz01" in err and "outside the sharing partitions (gpu)" in err


def test_gen_config_takes_node_for_what_sinfo_cannot_tell(monkeypatch, toml, capsys):
    sinfo(monkeypatch, SINFO + "new01|gpu:4|(null)|gpu\n")
    assert main(["gen-config", "--nodes-from-sinfo", "--config", str(toml)]) == 1
    assert "new01 (gpu:4)" in capsys.readouterr().err
    assert main(["gen-config", "--nodes-from-sinfo", "--node", "new01:a100:4",
                 "--config", str(toml)]) == 0
    out = capsys.readouterr().out
    assert "NodeName=gpu01,new01 Gres=gpu:a100:4,shard:320" in out


# ---- 3. Include ----------------------------------------------------------------------------------

def test_a_missing_include_is_an_error_naming_the_line(tmp_path):
    found = problems(check(tmp_path, PARAMS + NODES + "Include nodes-missing.conf\n"))
    assert len(found) == 1 and found[0][0] == "error"
    assert found[0][1].startswith(f"{tmp_path}/slurm.conf:11: Include nodes-missing.conf: ")
    assert "No such file or directory" in found[0][1]


def test_include_expands_the_cluster_name_as_slurm_does(tmp_path):
    (tmp_path / "test-nodes.conf").write_text(NODES)
    assert problems(check(tmp_path, PARAMS.replace("=test", "=Test")
                          + f"Include {tmp_path}/%c-nodes.conf\n")) == []
    # Slurm expands %c from a ClusterName set before the Include line only, and no wildcards.
    found = problems(check(tmp_path, "Include %c-nodes.conf\n" + PARAMS))
    assert [level for level, _ in found] == ["error"] and "ClusterName" in found[0][1]
    found = problems(check(tmp_path, PARAMS + "Include *-nodes.conf\n"))
    assert [level for level, _ in found] == ["error"] and "wildcard" in found[0][1]


def test_a_relative_include_is_found_beside_either_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.conf").write_text("Include b.conf\n")
    (tmp_path / "sub" / "b.conf").write_text(NODES)  # beside the including file (22.05)
    assert problems(check(tmp_path, PARAMS + "Include sub/a.conf\n")) == []
    (tmp_path / "sub" / "b.conf").rename(tmp_path / "b.conf")  # beside slurm.conf (23.02+)
    assert problems(check(tmp_path, PARAMS + "Include sub/a.conf\n")) == []


# ---- 4. duplicate NodeName lines -----------------------------------------------------------------

def test_a_node_defined_twice_is_an_error(tmp_path):
    found = problems(check(tmp_path, PARAMS + NODES + "NodeName=gpu[03-05] Weight=5\n"))
    assert len(found) == 1 and found[0][0] == "error"
    assert f"{tmp_path}/slurm.conf:11" in found[0][1] and "gpu[03-04]" in found[0][1]
    assert "gpu05" not in found[0][1] and "line 9" in found[0][1]
    # Twice on one line, or in an included file, is as fatal.
    (tmp_path / "more.conf").write_text("NodeName=n[1-2],n2\nNodeName=gpu01\n")
    found = problems(check(tmp_path, PARAMS + NODES + "Include more.conf\n"))
    assert [m for _, m in found] == [
        f"{tmp_path}/more.conf:1: NodeName n2 defined again (first at line 1): slurmctld "
        "refuses to start (\"Duplicated NodeName\")",
        f"{tmp_path}/more.conf:2: NodeName gpu01 defined again (first at {tmp_path}/slurm.conf:8): "
        "slurmctld refuses to start (\"Duplicated NodeName\")"]


def test_repeated_default_lines_are_fine(tmp_path):
    slurm = PARAMS + "NodeName=DEFAULT CPUs=8\nnodename=default Features=v100\n" + NODES
    assert problems(check(tmp_path, slurm)) == []


# ---- 5. the GresTypes fix ------------------------------------------------------------------------

def test_the_gres_types_fix_keeps_the_gres_the_nodes_use(tmp_path):
    found = [f for f in check(tmp_path, PARAMS.replace("GresTypes=gpu,shard\n", "") + NODES)
             if f.level != "ok"]
    assert [f.check for f in found] == ["gres-types"]
    assert found[0].fix.endswith("set: GresTypes=gpu,shard")
    # shard without gpu: slurmctld refuses to start.
    found = [f for f in check(tmp_path, PARAMS.replace("=gpu,shard", "=shard") + NODES)
             if f.level != "ok"]
    assert [f.check for f in found] == ["gres-types"] and "lacks gpu" in found[0].message
    assert found[0].fix.endswith("set: GresTypes=shard,gpu")


# ---- 6. files Slurm refuses: one error each, the rest still checked ------------------------------

def test_a_malformed_hostlist_in_slurm_conf_is_an_error_on_its_line(tmp_path):
    found = problems(check(tmp_path, PARAMS.replace("SelectType", "#") + NODES
                           + "NodeName=bad[04-01] CPUs=4\n"))
    assert ("error", f"{tmp_path}/slurm.conf:11: NodeName=bad[04-01]: reversed range 04-01 in "
            "'bad[04-01]'") in found
    assert any("SelectType=(unset)" in m for _, m in found)


def test_a_malformed_hostlist_in_gres_conf_is_an_error_on_its_line(tmp_path):
    found = problems(check(tmp_path, PARAMS.replace("SelectType", "#") + NODES,
                           GRES + "NodeName=gpu[01-02 Name=shard Count=4\n"))
    assert ("error", f"{tmp_path}/gres.conf:5: NodeName=gpu[01-02: malformed hostlist "
            "'gpu[01-02': unbalanced brackets") in found
    assert any("SelectType=(unset)" in m for _, m in found)


def test_gres_conf_as_a_directory_is_an_error(tmp_path):
    (tmp_path / "gres.conf").mkdir()
    found = problems(check(tmp_path, gres=None))
    assert found == [("error", f"cannot read {tmp_path}/gres.conf: Is a directory")]


def test_an_include_naming_a_directory_is_an_error_on_its_line(tmp_path):
    (tmp_path / "sub").mkdir()
    found = problems(check(tmp_path, PARAMS.replace("SelectType", "#") + NODES + "Include sub\n"))
    assert ("error", f"{tmp_path}/slurm.conf:11: Include sub: cannot read {tmp_path}/sub: "
            "Is a directory") in [(level, m.split(" (Slurm")[0]) for level, m in found]
    assert any("SelectType=(unset)" in m for _, m in found)


# ---- 7. one GPU type on several sockets ----------------------------------------------------------

@pytest.mark.parametrize("gres", ["gpu:a100:2,gpu:a100:2,shard:320",
                                  "gpu:a100:2(S:0),gpu:a100:2(S:1),shard:320"])
def test_one_type_split_by_socket_is_one_type(tmp_path, gres):
    slurm = PARAMS + NODES.replace("gpu:a100:4,shard:320", gres)
    found = check(tmp_path, slurm)
    assert problems(found) == []
    assert any(f.check == "shard-count" and f.message.startswith("gpu03: 320 shards")
               for f in found)


def test_gen_config_adds_up_one_type_on_several_sockets(monkeypatch, toml, capsys):
    sinfo(monkeypatch, "gpu01|gpu:a100:2(S:0),gpu:a100:2(S:1)|a100|gpu\n")
    assert main(["gen-config", "--nodes-from-sinfo", "--config", str(toml)]) == 0
    assert "NodeName=gpu01 Gres=gpu:a100:4,shard:320 Features=a100" in capsys.readouterr().out
