"""``slurm-gpushare simulate`` end to end on a tiny sacct export and the local cluster spec."""

from __future__ import annotations

import json

import pytest

from slurm_gpushare.cli import main
from slurm_gpushare.sim.run import default_data_dir

pytestmark = pytest.mark.skipif(not (default_data_dir() / "gavel").exists(),
                                reason="public data sets not found")

EXPORT = "JobID|User|Submit|Start|End|NNodes|AllocTRES\n" + "".join(
    f"{i}|u{i % 3}|{1000 + 60 * i}|{1000 + 60 * i}|{1000 + 60 * i + 600 + 37 * i}|1|"
    f"cpu=1,gres/gpu={1 if i % 5 else 2}\n" for i in range(1, 31))


def test_simulate_all_policies_writes_reports(tmp_path, capsys):
    trace = tmp_path / "sacct.txt"
    trace.write_text(EXPORT)
    out = tmp_path / "out"
    code = main(["simulate", "--trace", f"sacct:{trace}", "--cluster", "local", "--policy", "all",
                 "--seed", "3", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Verdict:" in printed and "gpushare" in printed  # a site's history: the verdict
    doc = json.loads((out / "summary.json").read_text())
    assert [r["policy"] for r in doc["summary"]][0] == "slurm-default"
    assert len(doc["summary"]) == 8
    assert all(r["done"] == 30 for r in doc["summary"])
    for name in ("summary.csv", "relative.csv", "jobs.csv.gz", "jct_cdf.png", "queue_length.png"):
        assert (out / name).stat().st_size > 0


def test_simulate_json_and_limit(tmp_path, capsys):
    trace = tmp_path / "sacct.txt"
    trace.write_text(EXPORT)
    code = main(["simulate", "--trace", f"sacct:{trace}", "--cluster", "local", "--policy",
                 "slurm-default,gpushare", "--limit", "5", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in doc["summary"]] == ["slurm-default", "gpushare"]
    assert doc["summary"][0]["jobs"] == 5
    assert doc["meta"]["shard_mib"] == 1024


def test_simulate_at_the_sites_shard_size(tmp_path, capsys):
    trace = tmp_path / "sacct.txt"
    trace.write_text(EXPORT)
    argv = ["simulate", "--trace", f"sacct:{trace}", "--cluster", "local", "--policy",
            "gpushare", "--limit", "5", "--json"]
    assert main(argv + ["--shard-mib", "256"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["shard_mib"] == 256
    assert main(argv + ["--shard-mib", "10"]) != 0
    assert "--shard-mib" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--policy", "fastest"], "unknown policy"),
    (["--cluster", "nowhere"], "no cluster spec"),
    (["--trace", "sacct:/nonexistent"], "not found"),
])
def test_simulate_errors_are_one_line(tmp_path, capsys, args, message):
    base = {"--trace": "philly", "--cluster": "local", "--policy": "all"}
    base.update(dict(zip(args[::2], args[1::2])))
    argv = ["simulate"] + [x for kv in base.items() for x in kv]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_simulate_on_a_sites_history_prints_a_verdict_at_80_columns(tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("GPUSHARE_CONFIG", str(tmp_path / "none.toml"))  # no store: public data
    trace = tmp_path / "sacct.txt"
    trace.write_text(EXPORT)
    assert main(["simulate", "--trace", f"sacct:{trace}", "--cluster", "local", "--policy",
                 "slurm-default,gpushare"]) == 0
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines()), printed
    assert "…" not in printed
    verdict = next(line for line in printed.splitlines() if line.startswith("Verdict:"))
    assert "turn sharing on for the gpu partitions" in verdict.lower()
    assert "GPU-h" in printed
    assert "public data" in printed  # each job's memory: no store, so public data


def test_simulate_json_names_each_jobs_inputs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUSHARE_CONFIG", str(tmp_path / "none.toml"))
    trace = tmp_path / "sacct.txt"
    trace.write_text(EXPORT)
    assert main(["simulate", "--trace", f"sacct:{trace}", "--cluster", "local", "--policy",
                 "slurm-default,gpushare", "--limit", "5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["inputs"]) == 30 and doc["verdict"]
    assert {i["memory_from"] for i in doc["inputs"]} == {"public data"}


def test_site_verdict_and_units():
    import pandas as pd

    from slurm_gpushare.sim.site import human_hours, human_seconds, verdict

    summary = pd.DataFrame([
        {"policy": "slurm-default", "gpu_hours": 10.0, "jct_mean_s": 3600.0,
         "queue_mean_s": 600.0, "oom_kills": 0},
        {"policy": "gpushare", "gpu_hours": 8.0, "jct_mean_s": 3744.0, "queue_mean_s": 300.0,
         "oom_kills": 0}])
    assert verdict(summary, ["gpu"]) == (
        "Turn sharing on for gpu: expected 2.00 GPU-h saved (20.0%), mean JCT +4%, mean "
        "queueing -5.0 min, OOM kills 0 (whole GPUs: 0).")
    summary.loc[1, "jct_mean_s"] = 4000.0
    assert verdict(summary, ["gpu"]).startswith("Turn sharing on for gpu but watch its costs")
    summary.loc[1, "gpu_hours"] = 11.0
    assert verdict(summary, ["gpu"]).startswith("Do not turn sharing on for gpu")
    assert (human_seconds(45), human_seconds(900), human_seconds(3 * 86400)) == (
        "45 s", "15.0 min", "3.0 d")
    assert (human_hours(0.0042), human_hours(2.5), human_hours(120.4)) == ("0.0042", "2.50",
                                                                           "120")


def test_simulate_with_the_knowledge_base_as_what_policies_know(tmp_path, capsys):
    trace = tmp_path / "sacct.txt"
    trace.write_text(EXPORT)
    code = main(["simulate", "--trace", f"sacct:{trace}", "--cluster", "local", "--policy",
                 "gpushare", "--knowledge", "kb", "--limit", "10", "--json"])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert doc["meta"]["knowledge"] == "kb" and doc["summary"][0]["done"] == 10
