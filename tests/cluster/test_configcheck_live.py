"""check-config and gen-config: Slurm's files read as Slurm reads them, the live cluster
checked clean, a deliberately broken copy of its configuration found out -- and the printed
fixes, applied as printed, make it clean again."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from slurm_gpushare.cli import main
from slurm_gpushare.core.config import parse_config
from slurm_gpushare.daemon.protocol import request

REPO = Path(__file__).resolve().parents[2]
CONFIG = parse_config({"gpu_types": {"v100": {"memory_gib": 16}, "a100": {"memory_gib": 80}},
                       "policy": {"sharing_partitions": ["gpu"]}})


# ---- reading Slurm's files -------------------------------------------------------------------------

# ---- on the real test cluster -----------------------------------------------------------------------

pytest_cluster = pytest.mark.cluster


@pytest.fixture
def live_env(cluster, monkeypatch):
    """Slurm clients talk to the running test cluster (the live half of every check), whose
    daemon answers (polled: it may be restarting)."""
    for name, value in cluster.client_environ().items():  # SLURM_CONF (and PATH for 24.11)
        monkeypatch.setenv(name, value)
    deadline = time.monotonic() + 45
    while True:
        try:
            if request(str(cluster.daemon_socket), {"v": 1, "op": "ping"}, 1.0).get("ok"):
                return cluster
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            pytest.fail("the test cluster's daemon does not answer")
        time.sleep(0.2)


@pytest_cluster
def test_the_running_test_cluster_is_clean(live_env, capsys):
    status = main(["check-config", "--config", str(live_env.daemon_config), "--json"])
    report = json.loads(capsys.readouterr().out)
    errors = [f for f in report["findings"] if f["level"] == "error"]
    assert status == 0 and errors == [] and report["ok"]
    checked = {(f["check"], f["where"]) for f in report["findings"] if f["level"] == "ok"}
    # Both halves ran: the file and the running slurmctld.
    assert ("gres-types", str(live_env.slurm_conf)) in checked
    assert ("gres-types", "slurmctld") in checked
    # The SJF lever (on in the test cluster) against slurmctld's own priority weights.
    assert ("priority", "slurmctld") in checked
    assert {f["check"] for f in report["findings"]} >= {
        "select-type", "accounting-tres", "job-submit", "hook-files", "hook-settings",
        "shard-count", "gres-conf", "daemon", "lua-modules", "telemetry"}


def _break(etc: Path) -> None:
    """Break a copy of the cluster's etc/ the ways admins do."""
    conf = etc / "slurm.conf"
    text = conf.read_text()
    text = text.replace("GresTypes=gpu,shard,mps", "GresTypes=gpu")
    text = re.sub(r"^AccountingStorageTRES=.*\n", "", text, flags=re.M)
    text = re.sub(r"(NodeName=v100-1 .*shard:)32", r"\g<1>30", text)
    text = re.sub(r"(NodeName=a100-2 .*Features=)a100,", r"\1", text)
    conf.write_text(text)
    gres = etc / "gres.conf"
    gres.write_text(gres.read_text().replace("NodeName=v100-1 Name=shard Count=32",
                                             "NodeName=v100-1 Name=shard Count=30"))
    (etc / "gpushare_tres.lua").unlink()
    hook = json.loads((etc / "gpushare_hook.json").read_text())
    hook["socket"] = "/run/elsewhere.sock"
    (etc / "gpushare_hook.json").write_text(json.dumps(hook))


def _apply(fix: str) -> None:
    """Apply a printed fix exactly as printed (a line to set in a file, or a command)."""
    match = re.match(r"^in (\S+) set: (.+)$", fix)
    if match:
        path, line = Path(match.group(1)), match.group(2)
        key = re.match(r"^(NodeName=\S+ Name=shard|NodeName=\S+|[A-Za-z]+=)", line).group(1)
        lines = path.read_text().splitlines()
        hits = [i for i, old in enumerate(lines) if old.startswith(key + ("" if key.endswith("=")
                                                                          else " "))]
        if hits:
            lines[hits[0]] = line
        else:
            lines.append(line)
        path.write_text("\n".join(lines) + "\n")
    elif fix.startswith("slurm-gpushare "):
        assert main(shlex.split(fix)[1:]) == 0
    else:
        subprocess.run(shlex.split(fix), check=True)


@pytest_cluster
def test_a_broken_copy_gets_the_right_findings_and_fixes(live_env, tmp_path, capsys):
    etc = tmp_path / "etc"
    shutil.copytree(live_env.etc, etc, symlinks=False)  # the hook's links become plain copies
    _break(etc)
    args = ["check-config", "--slurm-conf", str(etc / "slurm.conf"),
            "--config", str(etc / "gpushare.toml"), "--json"]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "problem(s) to fix" in captured.err
    report = json.loads(captured.out)
    broken = {"gres-types", "accounting-tres", "shard-count", "gres-conf", "node-features",
              "hook-files", "hook-settings"}
    errors = {(f["check"], f["message"].split(":")[0]): f for f in report["findings"]
              if f["level"] == "error"}
    assert {check for check, _ in errors} == broken
    conf, gres = etc / "slurm.conf", etc / "gres.conf"
    wanted = {
        ("gres-types", "GresTypes=gpu has neither shard nor mps"):
            f"in {conf} set: GresTypes=gpu,mps,shard",
        ("select-type", None): None,
        ("accounting-tres", "AccountingStorageTRES=(unset) lacks gres/mps, gres/shard"):
            f"in {conf} set: AccountingStorageTRES=gres/gpu,gres/mps,gres/shard",
        ("shard-count", "v100-1 has 30 shards; 32 expected (2 x 16 GiB v100, one shard per GiB)"):
            f"in {conf} set: NodeName=v100-1 NodeHostname=localhost "
            f"Port={live_env.ports['slurmd_base']} CPUs=8 "
            "RealMemory=8000 Gres=gpu:v100:2,shard:32 Features=v100,gpumem16g State=UNKNOWN",
        ("gres-conf", "gres.conf gives v100-1 30 shards; 32 expected (GPUs x GiB)"):
            f"in {gres} set: NodeName=v100-1 Name=shard Count=32",
        ("node-features", "a100-2 lacks feature a100"): None,
        ("hook-files", f"{etc / 'gpushare_tres.lua'} is missing"):
            f"install -m 0644 {REPO / 'slurm_gpushare' / 'lua' / 'gpushare_tres.lua'} {etc / 'gpushare_tres.lua'}",
        ("hook-settings", f"{etc / 'gpushare_hook.json'} points the hook at '/run/elsewhere.sock' "
                          "but the daemon listens on "
                          f"'{live_env.daemon_socket}'"):
            f"slurm-gpushare hook-config --config {etc / 'gpushare.toml'} -o "
            f"{etc / 'gpushare_hook.json'}",
    }
    for (check, message), fix in wanted.items():
        if message is None:
            continue
        assert (check, message) in errors, (check, message, sorted(errors))
        if fix:
            assert errors[(check, message)]["fix"] == fix
    assert errors[("node-features", "a100-2 lacks feature a100")]["fix"].endswith(
        "Features=gpumem80g,a100 State=UNKNOWN")
    assert not any(check == "select-type" for check, _ in errors)
    # The running slurmctld still has everything: only the files are at fault.
    assert all(f["where"] != "slurmctld" for f in errors.values())

    for finding in errors.values():
        _apply(finding["fix"])
    assert main(args) == 0, capsys.readouterr().out
    capsys.readouterr()


@pytest_cluster
def test_gen_config_from_sinfo_matches_the_cluster(live_env, capsys):
    assert main(["gen-config", "--nodes-from-sinfo", "--config",
                 str(live_env.daemon_config)]) == 0
    out = capsys.readouterr().out
    for node in live_env.nodes:
        # One shard per GiB, or 100 MPS units per GPU on MPS nodes (t4-1), as the cluster has.
        count = node.sharing_count
        assert re.search(rf"NodeName=\S*{node.gpu_type}\S* Gres=gpu:{node.gpu_type}:{node.gpus},"
                         rf"{node.sharing}:{count} Features={node.features}\n", out), out
        assert re.search(rf"Name={node.sharing} Count={count}\n", out)
