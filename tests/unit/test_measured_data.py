"""The project's own measurements on an H100 and an H200 (data/measured/<gpu>): complete, derived
as the harness derives them, read by ``kb predict-pairs``, and their figures when held out as
recorded."""

from __future__ import annotations

import csv
import itertools
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import bench_module

from slurm_gpushare.cli import kb as kb_cli
from slurm_gpushare.predict.datasets import load_measured, package_path

ROOT = Path(__file__).resolve().parents[2]
MEASURED = package_path("measured", "h100")


def _bench(name: str):
    return bench_module(name)


def test_the_set_has_every_job_alone_and_nearly_every_pair_with_self_pairs():
    pairs, profiles = load_measured("h100")
    solo = list(csv.DictReader(open(MEASURED / "solo.csv")))
    assert set(profiles) == {r["config"] for r in solo} and len(profiles) == 17
    paired = sorted({job for pair in pairs for job in pair[:2]})
    assert len(paired) == 13
    unordered = {tuple(sorted(p[:2])) for p in pairs}
    assert len(unordered) == len(pairs) == 90  # of 91: one did not fit the GPU time
    assert sum(a == b for a, b, *_ in pairs) == 12
    assert all(0.3 < s <= 1.2 for *_, sa, sb in pairs for s in (sa, sb))
    for profile in profiles.values():
        assert profile["mem_total_mib"] == 81559 and profile["gpu_type"] == "h100"
        assert 0 <= profile["gpu_util_pct"] <= profile["gpu_util_max_pct"] <= 100
        assert 0 < profile["mem_used_mib"] < profile["mem_total_mib"]
    env = json.loads((MEASURED / "env.json").read_text())
    assert env["gpu"].startswith("NVIDIA H100") and env["mps"]["available"] is True


def test_the_h200_set_has_its_jobs_alone_and_the_pairs_measured_before_the_deadline():
    # 12 configs, 4 of them light or host-bound, all loaded at once (--pool); the pairs phase
    # stopped at its deadline after 53 of the 78 unordered pairs, self-pairs included.
    folder = package_path("measured", "h200")
    pairs, profiles = load_measured("h200")
    solo = list(csv.DictReader(open(folder / "solo.csv")))
    assert set(profiles) == {r["config"] for r in solo} and len(profiles) == 12
    unordered = {tuple(sorted(p[:2])) for p in pairs}
    assert len(unordered) == len(pairs) == 53
    assert sum(a == b for a, b, *_ in pairs) == 6
    assert {job for pair in pairs for job in pair[:2]} == set(profiles)
    for profile in profiles.values():
        assert profile["mem_total_mib"] == 143771 and profile["gpu_type"] == "h200"
        assert 0 <= profile["gpu_util_pct"] <= profile["gpu_util_max_pct"] <= 100
    light = [job for job, p in profiles.items() if p["gpu_util_pct"] < 45]
    assert len(light) >= 3  # the jobs that barely wait for a busy partner
    env = json.loads((folder / "env.json").read_text())
    assert env["gpu"] == "NVIDIA H200" and "--pool" in env["command"]


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_shipped_speeds_are_what_the_harness_derives_from_the_raw_figures(tmp_path, gpu):
    folder = package_path("measured", gpu)
    for name in ("solo.csv", "pairs.csv", "env.json"):
        shutil.copy(folder / name, tmp_path / name)
    _bench("gpu_measure").derive(tmp_path)
    for name in ("coruns.csv", "profiles.csv"):
        assert (tmp_path / name).read_text() == (folder / name).read_text(), name


def test_timed_run_counts_iterations_between_completions_inside_the_window(monkeypatch):
    bench = _bench("gpu_measure")
    clock = itertools.count(0.0, 0.1)  # every iteration takes 0.1 s
    monkeypatch.setattr(bench.time, "monotonic", lambda: next(clock))
    figures = bench._timed_run(lambda: None, warm_s=1.0, measure_s=3.0)
    assert figures["its_per_s"] == pytest.approx(10.0)
    assert 29 <= figures["iterations"] <= 31


def test_kb_predict_pairs_reads_the_measured_profiles_and_co_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSHARE_STATE_DIR", str(tmp_path / "state"))
    groups = {g.name: g for g in kb_cli.commands}
    result = CliRunner().invoke(groups["kb"], [
        "predict-pairs", str(MEASURED / "profiles.csv"), "--co-runs",
        str(MEASURED / "coruns.csv"), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 17 * 18 // 2  # every unordered pair, self-pairs included
    assert all(0 < r["pred_speed_a"] <= 1 and r["fits_memory"] for r in rows)


@pytest.mark.parametrize("gpu,pairs", [("h100", 90), ("h200", 53)])
def test_held_out_figures_are_the_recorded_ones(gpu, pairs):
    from conftest import cached_json
    from slurm_gpushare.predict.evaluate import leave_one_data_set_out

    recorded = json.loads((ROOT / "bench" / "pairs_eval.json").read_text())
    figures = cached_json("pairs-leave-one-data-set-out",
                          lambda: leave_one_data_set_out(seeds=[0]))[f"measured-{gpu}"]
    entry = recorded["leave_one_data_set_out"][f"measured-{gpu}"]
    assert figures["cold"] == entry["cold"]
    assert figures["with_history"]["per_seed"][0] == entry["with_history"]["per_seed"][0]
    assert figures["cold"]["missing"] == 0 and figures["cold"]["pairs"] == pairs
    # Held out, the set cannot calibrate the margins it is judged by.
    assert f"measured-{gpu}" not in figures["fitted_on"]


def test_the_pool_measures_every_pair_once_with_a_twin_for_self_pairs(tmp_path, monkeypatch):
    # --pool: every config loaded once in its own worker, a second worker only for its
    # self-pair; a config that does not load fails its pairs and nothing else.
    import argparse
    import types

    bench = _bench("gpu_measure")
    started, runs = [], []

    class FakeWorker:
        def __init__(self, job_id, log_dir, extra_env=None):
            self.job_id, self.config = job_id, None
            self.proc = types.SimpleNamespace(poll=lambda: None, pid=0)
            started.append(self)

        def call(self, op, **args):
            self.config = args.get("config", self.config)
            return {"ok": self.config != "broken"}

        def close(self):
            pass

    def fake_run_together(workers, warm_s, measure_s, sample=True):
        runs.append(tuple(w.config for w in workers))
        sampling = types.SimpleNamespace(readings=[], per_process=lambda pids: (50.0, 1000))
        return ([{"ok": True, "its_per_s": 10.0 / len(workers)} for _ in workers],
                [{"attribution": "process"} for _ in workers], sampling)

    monkeypatch.setattr(bench, "Worker", FakeWorker)
    monkeypatch.setattr(bench, "run_together", fake_run_together)
    monkeypatch.setattr(bench, "_device_util", lambda readings: None)
    args = argparse.Namespace(deadline_s=0, warm_s=1.0, measure_s=3.0)
    bench.pool_pairs_phase(tmp_path, tmp_path, args, ["x", "y", "broken"],
                           done=frozenset({("x", "y")}))
    rows = list(csv.DictReader(open(tmp_path / "pairs.csv")))
    assert [(r["job_a"], r["job_b"], r["status"]) for r in rows] == [
        ("x", "x", "ok"), ("x", "broken", "failed: b did not load"), ("y", "y", "ok"),
        ("y", "broken", "failed: b did not load"), ("broken", "broken", "failed: a did not load")]
    # x, its twin, broken, y, y's twin, broken's twin: each loaded once.
    assert sorted(w.config for w in started) == ["broken", "broken", "x", "x", "y", "y"]
    # Each config alone once before its first pair, then the pairs themselves.
    assert runs == [("x",), ("x", "x"), ("y",), ("y", "y")]
    assert rows[0]["solo_a_again"] == "10.0" and rows[0]["its_a"] == "5.0"
    assert rows[2]["solo_a_again"] == "10.0"
