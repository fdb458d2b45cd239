"""bench/sim_bounds.py's pair-evidence judge: the prior and each pair's own co-runs decide,
per-job corrections play no part."""

from conftest import bench_module
from slurm_gpushare.predict.pairs import default_model


def _bench():
    return bench_module("sim_bounds")


def profile(util):
    return {"gpu_util_pct": util, "mem_util_pct": util / 2}


PROFILES = {"x": profile(30), "y": profile(30), "z": profile(30)}
SLOW_XY = [("x", "y", 0.35, 0.35)] * 3  # far below what their telemetry predicts


def test_a_pair_measured_slow_is_kept_apart_and_others_stay_at_the_prior():
    bench = _bench()
    cold = default_model()
    judge = bench.PairEvidenceModel.of(cold).learn(SLOW_XY, PROFILES)
    product = cold.fitted_copy().learn(SLOW_XY, PROFILES)
    x, y, z = PROFILES["x"], PROFILES["y"], PROFILES["z"]
    assert cold.fast_enough([x, y], ["x", "y"]) and not judge.fast_enough([x, y], ["x", "y"])
    # x and z never ran together: the judge keeps the cold prior's verdict and speeds, where the
    # product carries x's correction (learned next to y) over to z.
    assert judge.safe_speeds([x, z], ["x", "z"]) == cold.safe_speeds([x, z], ["x", "z"])
    assert product.suffers["x"] > 0
    assert product.safe_speeds([x, z], ["x", "z"])[0] < judge.safe_speeds([x, z], ["x", "z"])[0]


def test_copies_are_sized_by_the_self_pair_measured():
    bench = _bench()
    cold = default_model()
    x = PROFILES["x"]
    others_only = bench.PairEvidenceModel.of(cold).learn(SLOW_XY, PROFILES)
    assert others_only.copies_allowed(x, "x") == cold.copies_allowed(x, "x") > 1
    copies = bench.PairEvidenceModel.of(cold).learn([("x", "x", 0.3, 0.3)], PROFILES)
    assert copies.copies_allowed(x, "x") == 1
