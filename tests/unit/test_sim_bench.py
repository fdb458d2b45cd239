"""bench/sim_philly.py's checks over draws: averages per seed, paired wins, ranges."""

import pytest

from conftest import bench_module


def _bench():
    return bench_module("sim_philly")


def _run(**figures):
    """A run's summary: policy -> (mean JCT, p95 JCT)."""
    return {"summary": [{"policy": p, "jct_mean_s": m, "jct_p95_s": q}
                        for p, (m, q) in figures.items()]}


def test_checks_over_draws_average_each_seed_and_count_paired_wins():
    bench = _bench()
    seeds = [
        {**_run(**{"gpushare-sjf": (90, 110), "sjf-bsbf": (100, 100)}),
         "replicates": [_run(**{"gpushare-sjf": (90, 80), "sjf-bsbf": (100, 100)})]},
        {**_run(**{"gpushare-sjf": (120, 100), "sjf-bsbf": (100, 105)}),
         "replicates": [_run(**{"gpushare-sjf": (120, 100), "sjf-bsbf": (100, 105)})]},
    ]
    out = bench.over_draws(seeds)
    assert out["draws"] == 2
    p95 = out["gpushare-sjf_vs_sjf-bsbf_jct_p95_s"]
    # Seed 0: 110 and 80 average 95 < 100 (a win on the average, one of two draws won).
    assert p95["gpushare-sjf"]["per_seed"] == [95, 100]
    assert (p95["seeds_won"], p95["runs_won"], p95["runs"]) == (2, 3, 4)
    assert p95["better_on_average"] and p95["goal_met"]  # with 2 seeds, both must be won
    mean = out["gpushare-sjf_vs_sjf-bsbf_jct_mean_s"]
    assert (mean["seeds_won"], mean["runs_won"]) == (1, 2) and not mean["goal_met"]
    # Relative range of a figure over a seed's draws: (max - min) / mean.
    ranges = out["relative_range"]["gpushare-sjf"]["jct_p95_s"]["per_seed"]
    assert ranges == [pytest.approx(30 / 95), 0.0]
    assert "gpushare_vs_slurm-default_jct_mean" not in out  # neither policy ran
