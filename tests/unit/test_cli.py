"""The CLI contract: main(argv) returns a status; errors are one line; reference files parse."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_gpushare.cli import main
from slurm_gpushare.core.config import load_config

REPO = Path(__file__).resolve().parents[2]


def test_reference_config_parses_and_lists_every_setting():
    config = load_config(REPO / "etc" / "gpushare.toml")
    assert config.policy.sharing_partitions == ("gpu",)
    assert {g.name: g.memory_gib for g in config.gpu_types} == {"v100": 15, "a100": 80}
    text = (REPO / "etc" / "gpushare.toml").read_text()
    for section in (config.daemon, config.policy, config.hook):
        for name in section.__dataclass_fields__:
            assert f"\n{name} = " in text, f"{name} is not documented in etc/gpushare.toml"


def test_hook_config_writes_the_hooks_settings(tmp_path, capsys):
    out = tmp_path / "gpushare_hook.json"
    assert main(["hook-config", "--config", str(REPO / "etc" / "gpushare.toml"), "-o", str(out)]) == 0
    settings = json.loads(out.read_text())
    assert settings == {"socket": "/run/slurm-gpushare/daemon.sock", "timeout_ms": 50,
                        "breaker_failures": 3, "breaker_cooldown_s": 30.0,
                        "breaker_first_cooldown_s": 1.0,
                        "breaker_window": 20, "breaker_failure_rate": 0.5,
                        "breaker_slow_ms": 20.0, "max_script_bytes": 65536,
                        "max_reply_bytes": 65536, "max_share_count": 80}


def test_errors_are_one_line_with_nonzero_exit(tmp_path, capsys):
    assert main(["hook-config", "--config", str(tmp_path / "missing.toml")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config file not found" in err and "Traceback" not in err


def test_ping_without_daemon_is_a_clear_error(tmp_path, capsys):
    assert main(["ping", "--socket", str(tmp_path / "none.sock")]) == 1
    assert "daemon not reachable" in capsys.readouterr().err


def test_ping_with_daemon(daemon, capsys):
    from slurm_gpushare.daemon.clusterview import SlurmClusterView

    daemon.service.view = SlurmClusterView(daemon.service.config)  # not read from Slurm yet
    assert main(["ping", "--socket", daemon.socket, "--json"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert reply["ok"] is True
    # The daemon's view of the cluster: how many GPU nodes take jobs, when Slurm was last read.
    assert set(reply["view"]) == {"nodes", "usable", "refreshed_at"}
    assert main(["ping", "--socket", daemon.socket]) == 0
    assert "0 of 0 GPU nodes take jobs; not read from Slurm yet" in capsys.readouterr().out


def test_usage_errors_exit_2(capsys):
    assert main(["no-such-command"]) == 2


def test_daemon_commands_do_not_import_the_heavy_modules():
    import subprocess
    import sys

    code = ("import sys; from slurm_gpushare.cli import main; main(['serve', '--help']); "
            "print(sorted(m for m in ('sklearn', 'pandas', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(REPO), timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_exit_codes_of_commands_reach_the_caller(tmp_path, capsys):
    # check-config exits 1 when it finds errors (a slurm.conf with no GPU sharing at all).
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nSelectType=select/linear\n")
    assert main(["check-config", "--no-live", "--slurm-conf", str(conf)]) == 1
    assert "error" in capsys.readouterr().out.lower()


def test_ping_fails_when_the_daemon_cannot_decide(daemon, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("model file unreadable")

    daemon.service.estimator.estimate = broken
    assert main(["ping", "--socket", daemon.socket]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot decide: RuntimeError: model file unreadable" in err
