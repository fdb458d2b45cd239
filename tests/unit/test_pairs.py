"""The pair predictor: monotone, self-pairs and groups, estimator conventions, learning."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from conftest import cached_json
from slurm_gpushare.predict.estimators import PairSpeedModel
from slurm_gpushare.predict.pairs import (DEFAULT_LATENCY, calibration_sets, default_model,
                                          demand_of, fair_shares, fits_memory, training_sides)

GRID = np.linspace(0, 100, 11)


def profile(sm, mem=None, used=None, total=16384):
    return {"gpu_util_pct": sm, "mem_util_pct": mem, "mem_used_mib": used, "mem_total_mib": total}


@pytest.fixture(scope="module")
def model():
    return default_model()


def _with_corrections(model):
    learned = default_model()
    learned.suffers = {"a": 0.8, "b": -0.5}
    learned.hurts = {"a": -0.7, "b": 1.1}
    return learned


@pytest.mark.parametrize("corrected", [False, True])
def test_a_busier_partner_never_predicts_a_faster_job(model, corrected):
    model = _with_corrections(model) if corrected else model
    keys = ["a", "b"]
    for own_sm, own_mem in itertools.product(GRID, GRID):
        own = profile(own_sm, own_mem)
        speeds = np.array([[model.predict_group([own, profile(sm, mem)], keys)[0]
                            for mem in GRID] for sm in GRID])
        assert (np.diff(speeds, axis=0) <= 1e-12).all(), (own_sm, own_mem)  # partner SM
        assert (np.diff(speeds, axis=1) <= 1e-12).all(), (own_sm, own_mem)  # partner memory


def test_a_third_co_runner_never_speeds_anyone_up(model):
    for a, b, c in itertools.product(GRID[::2], repeat=3):
        pair = model.predict_group([profile(a, a / 2), profile(b, b / 2)])
        group = model.predict_group([profile(a, a / 2), profile(b, b / 2), profile(c, c / 2)])
        assert group[0] <= pair[0] + 1e-12 and group[1] <= pair[1] + 1e-12
        assert all(0 < s <= 1 for s in group)


def test_self_pairs_are_defined_and_symmetric(model):
    for sm in GRID:
        a, b = model.predict_group([profile(sm, sm / 2)] * 2)
        assert a == b and 0 < a <= 1
    idle = model.predict_group([profile(0, 0)] * 2)
    assert idle == [1.0, 1.0]  # two idle jobs do not slow each other


def test_prior_parameters_are_non_negative_and_fitted_on_the_packaged_sets(model):
    sides = training_sides()
    assert set(sides["group"]) == {"gavel-k80", "gavel-p100", "gavel-v100", "alnair-p100",
                                   "measured-h100", "measured-h200"}
    assert 0.0 <= model.latency <= 1.0
    assert 1.0 <= model.margin <= 6.0


def test_margins_are_calibrated_on_the_daemons_kind_of_telemetry():
    # The margins cover the error the daemon makes from NVML means: they are calibrated on the
    # project's own measurements where those are in the training data, on every set where not.
    sides = training_sides()
    assert calibration_sets(sides["group"]) == ["measured-h100", "measured-h200"]
    measured = sides["group"].str.startswith("measured-")
    everything = PairSpeedModel().fit(sides)
    own_only = PairSpeedModel().fit(sides[measured])
    assert (everything.margin_, everything.margin_learned_) == (
        own_only.margin_, own_only.margin_learned_)
    # One GPU's pairs do not cover another's: the H100 alone asked for 1.0, which left 1 of the
    # H200's 15 recommended pairs below 0.7x; both together ask for more.
    h100_only = PairSpeedModel().fit(sides[sides["group"] == "measured-h100"])
    assert everything.margin_ > h100_only.margin_
    public = sides[~measured]
    alnair_only = PairSpeedModel().fit(sides[sides["group"] == "alnair-p100"])
    assert PairSpeedModel().fit(public).margin_ == alnair_only.margin_ > everything.margin_


def test_the_prior_is_calibrated_in_absolute_speed(model):
    # Time slicing: jobs that keep the GPU busy all the time share it equally, whatever data
    # the margins were calibrated on; a partner that never uses the GPU costs nothing.
    busy = profile(100, 50)
    assert model.predict_group([busy, busy]) == pytest.approx([0.5, 0.5])
    assert model.predict_group([busy] * 3) == pytest.approx([1 / 3] * 3)
    assert model.predict_group([profile(60, 30), profile(0, 0)])[0] == 1.0
    # A light job next to a busy one waits for it (latency) but less than a busy one would;
    # the busy one barely notices the light one.
    light, heavy = model.predict_group([profile(10, 5), busy])
    assert 0.5 < light < heavy < 1.0


def test_time_slicing_saturates_at_the_max_min_fair_share(model):
    # Together the jobs ask for more than the GPU has: the light one gets what it asks (less
    # than half), the busy one the rest and no more; measured on an H100, ResNet-50 training
    # (93% busy) next to a launch-bound CNN (46%) ran at 0.59x against the 0.58x its fair share
    # gives (collision alone: 0.69x).
    assert fair_shares([0.46, 0.9]) == pytest.approx([0.46, 0.54])
    assert fair_shares([0.2, 0.9, 0.9]) == pytest.approx([0.2, 0.4, 0.4])
    assert fair_shares([0.3, 0.3]) == [0.3, 0.3]
    heavy, light = model.predict_group([profile(90, 45), profile(46, 20)])
    assert heavy == pytest.approx(0.54 / 0.9)
    assert light > heavy  # the light job only waits for the busy one's time slices


def test_a_jobs_history_never_lifts_the_gpus_time_running_out():
    # Co-runs next to light partners (no slowdown) teach a job large negative corrections;
    # they must not carry over to a partner that, with it, asks for more than the whole GPU:
    # two jobs that each keep the GPU busy all the time share its time, whatever their past.
    # (On a public set of 1,388 measured pairs, such corrections lifted saturated pairs
    # measured at 0.56x to 0.92x predicted.)
    profiles = {"busy": profile(100, 40), "light": profile(10, 5)}
    learned = default_model().learn([("busy", "light", 1.0, 1.0)] * 5, profiles)
    assert learned.suffers["busy"] < 0 and learned.hurts["busy"] < 0
    speeds = learned.predict_group([profiles["busy"]] * 2, ["busy", "busy"])
    assert max(speeds) <= 0.5 + 1e-9
    assert not learned.recommend([profiles["busy"]] * 2, ["busy", "busy"])
    assert learned.copies_allowed(profiles["busy"], "busy") == 1


def test_shrinkage_is_chosen_on_the_training_data():
    sides = training_sides()
    sides = sides[sides["group"] == "alnair-p100"]
    chosen = PairSpeedModel().fit(sides)
    assert chosen.shrinkage_ in (0.25, 0.5, 1.0, 2.0)
    assert PairSpeedModel(shrinkage=3.0).fit(sides).shrinkage_ == 3.0
    assert 0.0 <= chosen.coef_[0] <= 1.0


def test_the_shape_is_the_most_cautious_one_the_daemons_kind_of_telemetry_cannot_tell_apart():
    # The latency is chosen on the NVML-measured pairs, like the margins: on the H100 pairs
    # 0.0 ranks best (0.939) but 0.4 is within one standard error (0.929); on the H200 pairs,
    # where light jobs next to busy ones barely wait, 0.0 ranks 0.868 and 0.4 only 0.732. Both
    # sets weigh the same: 0.1 is the largest within one standard error of the best. A larger
    # latency predicts more slowdown for a light job next to a busy one. Without such pairs
    # (the public sets' telemetry cannot tell), the middle of the physical limits.
    sides = training_sides()
    chosen = PairSpeedModel().fit(sides)
    assert chosen.coef_[0] == pytest.approx(0.1)
    assert PairSpeedModel(random_state=7).fit(sides).coef_[0] == pytest.approx(0.1)
    h100 = sides[sides["group"] == "measured-h100"]
    assert PairSpeedModel().fit(h100).coef_[0] == pytest.approx(0.4)
    measured = sides["group"].str.startswith("measured-")
    assert PairSpeedModel().fit(sides[~measured]).coef_[0] == DEFAULT_LATENCY
    assert PairSpeedModel(latency=0.8).fit(sides).coef_[0] == 0.8
    # Only the measured pairs choose it: the public sides change nothing.
    assert PairSpeedModel().fit(sides[measured]).coef_[0] == chosen.coef_[0]


def test_estimator_conventions():
    fresh = PairSpeedModel(threshold=0.8, shrinkage=3.0)
    assert fresh.get_params() == {"latency": None, "threshold": 0.8, "max_bad_rate": 0.01,
                                  "shrinkage": 3.0, "random_state": 0}
    assert not [k for k in vars(fresh) if k.endswith("_")]
    with pytest.raises(NotFittedError):
        fresh.predict_group([profile(50), profile(50)])
    with pytest.raises(NotFittedError):
        fresh.learn([], {})


def test_corrections_shrink_towards_the_prior():
    prior = default_model()
    profiles = {"x": profile(40, 20), "y": profile(40, 20)}
    cold = prior.predict_isd([profiles["x"], profiles["y"]], ["x", "y"])[0]
    measured_isd = 4 * cold + 0.2  # x suffers far more than the prior says
    one = default_model().learn([("x", "y", 1 / (1 + measured_isd), None)], profiles)
    many = default_model().learn([("x", "y", 1 / (1 + measured_isd), None)] * 20, profiles)
    isd_one = one.predict_isd([profiles["x"], profiles["y"]], ["x", "y"])[0]
    isd_many = many.predict_isd([profiles["x"], profiles["y"]], ["x", "y"])[0]
    assert cold < isd_one < isd_many < measured_isd * 1.01
    assert isd_many == pytest.approx(measured_isd, rel=0.15)
    # What x suffers carries to partners x was never measured with; y, which hurt x, is
    # expected to hurt others more too, while its own (unmeasured) side stays at the prior.
    z = profile(60, 30)
    assert one.predict_group([profiles["x"], z], ["x", "z"])[0] < prior.predict_group(
        [profiles["x"], z], ["x", "z"])[0]
    y_next_to_z, z_next_to_y = one.predict_group([profiles["y"], z], ["y", "z"])
    prior_y, prior_z = prior.predict_group([profiles["y"], z], ["y", "z"])
    assert y_next_to_z == pytest.approx(prior_y) and z_next_to_y < prior_z


def test_a_job_that_hurts_others_is_learned_from_its_partners_side():
    profiles = {"noisy": profile(10, 5), "p": profile(50, 20), "q": profile(50, 20)}
    learned = default_model().learn([("noisy", "p", 1.0, 0.4), ("q", "noisy", 0.45, 1.0)],
                                    profiles)
    assert learned.hurts["noisy"] > 0
    r = profile(50, 20)
    before = default_model().predict_group([r, profiles["noisy"]], ["r", "noisy"])[0]
    after = learned.predict_group([r, profiles["noisy"]], ["r", "noisy"])[0]
    assert after < before


def test_missing_means_come_from_peaks_and_memory_from_sm():
    assert demand_of({"gpu_util_max_pct": 80}).sm == pytest.approx(0.4)
    assert demand_of({"gpu_util_pct": 60}).mem == pytest.approx(0.3)
    with pytest.raises(ValueError):
        demand_of({"mem_total_mib": 1})


def test_recommend_needs_memory_and_speed(model):
    light = profile(2, 1, used=2000)
    assert model.recommend([light, light])
    assert not model.recommend([profile(2, 1, used=9000)] * 2)  # 18 GB on a 16 GB GPU
    assert not model.recommend([profile(100, 80, used=1000)] * 2)
    assert fits_memory([light, profile(2, 1)]) is None
    assert math.isclose(model.safe_speeds([light, light])[0],
                        1 / (1 + model.margin * model.predict_isd([light, light])[0]))


def test_the_packaged_prior_is_the_fit_of_the_packaged_data():
    from slurm_gpushare.predict.persist import fitted_prior, prior_path
    import json

    stored = json.loads(prior_path().read_text())
    fresh = cached_json("pair-prior", fitted_prior)
    assert stored["data"] == fresh["data"] and stored["sides"] == fresh["sides"]
    assert stored["margin"] == fresh["margin"]
    assert stored["shrinkage"] == fresh["shrinkage"]
    assert stored["margin_learned"] == fresh["margin_learned"]
    for name, value in fresh["parameters"].items():
        assert stored["parameters"][name] == pytest.approx(value, abs=1e-9)


def test_leave_one_data_set_out_learns_from_co_runs():
    from slurm_gpushare.predict.evaluate import leave_one_data_set_out

    result = cached_json("pairs-leave-one-data-set-out", lambda: leave_one_data_set_out(seeds=[0]))
    assert set(result) == {"gavel-k80", "gavel-p100", "gavel-v100", "alnair-p100",
                           "measured-h100", "measured-h200"}
    for name, entry in result.items():
        assert name not in entry["fitted_on"]
        assert entry["cold"]["missing"] == 0
        run = entry["with_history"]["per_seed"][0]
        assert run["test_pairs"] + run["history_pairs"] == entry["cold"]["pairs"]
        # Three co-runs per job as history rank the other pairs better than the prior alone, by
        # a clear step where the prior ranks them poorly; where it already ranks them well they
        # cost little (the H100 set held out, seed 0: 0.925 against 0.939 cold; over five
        # seeds 0.944 against 0.937, bench/pairs_eval.json).
        if run["cold"]["spearman"] < 0.8:
            assert run["history"]["spearman"] > run["cold"]["spearman"] + 0.1, name
        else:
            assert run["history"]["spearman"] > run["cold"]["spearman"] - 0.02, name


@pytest.mark.parametrize("util,mem", [(1.0, 0.3), (5.0, 2.0), (25.0, 10.0), (45.0, 25.0),
                                      (80.0, 45.0), (100.0, 90.0)])
def test_copies_allowed_is_the_largest_group_of_copies_the_safe_speeds_accept(util, mem):
    model = default_model()
    profile = {"gpu_util_pct": util, "mem_util_pct": mem}
    copies = model.copies_allowed(profile, limit=60)
    assert 1 <= copies <= 60
    assert copies == 1 or min(model.safe_speeds([profile] * copies)) >= model.threshold
    assert copies == 60 or min(model.safe_speeds([profile] * (copies + 1))) < model.threshold


@pytest.mark.parametrize("suffers,hurts", [(-1.5, -1.5), (-0.5, 0.2), (0.7, 0.4)])
@pytest.mark.parametrize("util", [3.0, 12.0, 30.0, 55.0, 90.0])
def test_copies_allowed_holds_with_corrections_where_saturation_decides(util, suffers, hurts):
    # Corrections that make a job collide little leave the GPU's time as the limit:
    # the closed form must still give the largest group the safe speeds accept.
    model = default_model()
    model.suffers, model.hurts = {"k": suffers}, {"k": hurts}
    profile = {"gpu_util_pct": util, "mem_util_pct": util / 2}
    copies = model.copies_allowed(profile, "k", limit=60)
    group = lambda m: min(model.safe_speeds([profile] * m, ["k"] * m))  # noqa: E731
    assert copies == 1 or group(copies) >= model.threshold
    assert copies == 60 or group(copies + 1) < model.threshold
