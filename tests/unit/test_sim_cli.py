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
    assert "relative to slurm-default" in printed and "gpushare" in printed
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
