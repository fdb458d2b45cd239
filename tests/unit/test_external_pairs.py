"""Public co-location sets kept for evaluation: Lucid's artifact converted into the files
``kb predict-pairs`` reads (bench/lucid_pairs.py), and judged by bench/pairs_eval.py
--external like a held-out set."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import bench_module
from slurm_gpushare.cli import kb as kb_cli
from slurm_gpushare.predict.evaluate import held_out_public


# Lucid's two files, in their own layout (a few rows; the real ones have 66 jobs, 1,388 pairs).
ALONE = """model,dataset,batchsize,amp,speed,gpu_util,gmem_util,gmem,label
BERT,SQuAD,32,0,84.872,99.689,62.484,20162.0,2
DCGAN,LSUN,32,1,1561.581,34.9,11.8,2730.0,0
ResNet18,CIFAR-10,64,0,2000.0,81.0,30.0,3000.0,1
PPO,LunarLander,32,0,500.0,8.0,1.0,2100.0,0
"""
COLOCATED = """,model1,dataset1,gpu_num1,batchsize1,amp1,speed1,model2,dataset2,gpu_num2,batchsize2,amp2,speed2,gpu_util,gmem_util,gmem
0,DCGAN,LSUN,1,32,1,0.98,PPO,LunarLander,1,32,0,1.02,40.0,12.0,4830
1,ResNet18,CIFAR-10,1,64,0,0.62,ResNet18,CIFAR-10,1,64,0,0.61,100.0,55.0,6000
2,ResNet18,CIFAR-10,1,64,0,0.91,PPO,LunarLander,1,32,0,0.97,85.0,31.0,5100
3,DCGAN,LSUN,1,32,1,0.95,ResNet18,CIFAR-10,1,64,0,0.80,95.0,40.0,5730
"""


def _bench(name: str):
    return bench_module(name)


@pytest.fixture
def converted(tmp_path):
    checkout = tmp_path / "Lucid"
    (checkout / "simulation" / "data").mkdir(parents=True)
    (checkout / "simulation" / "analyzer").mkdir(parents=True)
    (checkout / "simulation" / "data" / "colocate_info.csv").write_text(COLOCATED)
    (checkout / "simulation" / "analyzer" / "single_data.csv").write_text(ALONE)
    out = tmp_path / "kb"
    assert _bench("lucid_pairs").main([str(checkout), str(out)]) == 0
    return out


def test_lucid_converts_into_the_files_kb_predict_pairs_reads(converted):
    profiles = (converted / "profiles.csv").read_text().splitlines()
    assert profiles[0] == "job,gpu_util_pct,mem_util_pct,mem_used_mib,mem_total_mib,gpu_type"
    assert "DCGAN-LSUN-b32-amp,34.9,11.8,2730.0,24576,rtx3090" in profiles
    coruns = (converted / "coruns.csv").read_text().splitlines()
    assert coruns[0] == "job_a,job_b,speed_a,speed_b" and len(coruns) == 5
    assert "ResNet18-CIFAR-10-b64,ResNet18-CIFAR-10-b64,0.62,0.61" in coruns
    result = CliRunner().invoke(
        [g for g in kb_cli.commands if g.name == "kb"][0],
        ["predict-pairs", str(converted / "profiles.csv"), "--co-runs",
         str(converted / "coruns.csv"), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)) == 4 * 5 // 2  # every pair, self-pairs included


def test_a_converted_set_is_judged_like_a_held_out_one(converted):
    figures = held_out_public(
        [("lucid", str(converted / "profiles.csv"), str(converted / "coruns.csv"))], seeds=[0])
    entry = figures["lucid"]
    assert "lucid" not in entry["fitted_on"]
    assert entry["cold"]["pairs"] == 4 and entry["cold"]["missing"] == 0
    # The busy self-pair (about 0.6x each) is not recommended.
    assert entry["cold"]["recommended_bad_share"] in (None, 0.0)
    assert held_out_public([]) == {}


def test_a_checkout_without_the_files_is_a_one_line_error(tmp_path, capsys):
    assert _bench("lucid_pairs").main([str(tmp_path / "nothing"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_pairs_eval_rejects_a_malformed_external_set():
    with pytest.raises(SystemExit) as exited:
        _bench("pairs_eval").main(["--external", "lucid=/only/one/file.csv"])
    assert exited.value.code == 2


def test_a_co_run_of_a_job_without_a_profile_is_a_one_line_error(tmp_path, capsys):
    checkout = tmp_path / "Lucid"
    (checkout / "simulation" / "data").mkdir(parents=True)
    (checkout / "simulation" / "analyzer").mkdir(parents=True)
    (checkout / "simulation" / "data" / "colocate_info.csv").write_text(
        COLOCATED.replace("PPO,LunarLander", "TD3,BipedalWalker"))
    (checkout / "simulation" / "analyzer" / "single_data.csv").write_text(ALONE)
    assert _bench("lucid_pairs").main([str(checkout), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: co-runs name jobs with no profile") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing half-written


def _synthetic_set(seed: int, learnable: bool):
    """30 jobs, every pair measured; speeds a function of the profiles, or noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    profiles = {f"j{i}": {"gpu_util_pct": float(rng.uniform(5, 100)),
                          "mem_util_pct": float(rng.uniform(1, 60)),
                          "mem_used_mib": 2000.0, "mem_total_mib": 24576}
                for i in range(30)}
    jobs = sorted(profiles)
    pairs = []
    for i, a in enumerate(jobs):
        for b in jobs[i:]:
            ua, ub = profiles[a]["gpu_util_pct"] / 100, profiles[b]["gpu_util_pct"] / 100
            if learnable:
                speed_a, speed_b = 1 / (1 + ua * ub * 2), 1 / (1 + ub * ua * 2)
            else:
                speed_a, speed_b = rng.uniform(0.4, 1.0), rng.uniform(0.4, 1.0)
            pairs.append((a, b, speed_a, speed_b))
    return pairs, profiles


def test_the_information_ceiling_finds_what_the_profiles_carry_and_nothing_more():
    from slurm_gpushare.predict.evaluate import information_ceiling
    from slurm_gpushare.predict.pairs import default_model

    model = default_model()
    carried = information_ceiling(model, *_synthetic_set(0, learnable=True), seeds=[0, 1])
    noise = information_ceiling(model, *_synthetic_set(0, learnable=False), seeds=[0, 1])
    assert len(carried["per_seed"]) == 2 and carried["per_seed"][0]["test_pairs"] == 55
    assert carried["fitted_on_set_spearman_pairs"]["min"] > 0.8
    assert abs(noise["fitted_on_set_spearman_pairs"]["mean"]) < 0.3
    # Too few pairs to hold jobs out: no figure rather than a meaningless one.
    pairs, profiles = _synthetic_set(0, learnable=True)
    few = information_ceiling(model, pairs[:15], profiles, seeds=[0])
    assert few["per_seed"] == [] and few["fitted_on_set_spearman_pairs"]["mean"] is None


def test_a_pair_set_is_read_by_kb_predict_pairs_own_reader(tmp_path):
    """load_pair_set (bench/pairs_eval.py --external, the packaged measurements) reads the files
    as kb predict-pairs does: pairs it cannot judge are left out, a bad value is one error."""
    from slurm_gpushare.predict.datasets import UnreadableDataSet, load_pair_set

    profiles = tmp_path / "profiles.csv"
    profiles.write_text("\ufeffjob,gpu_util_pct,mem_util_pct,mem_used_mib,mem_total_mib,gpu_type\n"
                        "a,90,40,1000,24576,x\nb,20,,1000,24576,x\n")
    coruns = tmp_path / "coruns.csv"
    coruns.write_text("job_a,job_b,speed_a,speed_b\na,b,0.8,0.95\na,a,0.5,\nb,ghost,0.9,0.9\n")
    pairs, by_job = load_pair_set(profiles, coruns)
    assert pairs == [("a", "b", 0.8, 0.95)]
    assert by_job["b"]["mem_util_pct"] is None and by_job["a"]["gpu_util_pct"] == 90.0
    coruns.write_text("job_a,job_b,speed_a,speed_b\na,b,fast,0.95\n")
    with pytest.raises(UnreadableDataSet, match="line 2: speed_a is not a number"):
        load_pair_set(profiles, coruns)
