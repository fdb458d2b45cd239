import pytest

from conftest import cached_json
from slurm_gpushare.predict.datasets import load_gavel_isolated
from slurm_gpushare.predict.evaluate import evaluate_transfer
from slurm_gpushare.predict.estimators import RuntimeTransfer


def test_gavel_copy_has_26_job_types_on_three_gpus():
    frame = load_gavel_isolated()
    assert frame.job.nunique() == 26
    assert set(frame.gpu) == {"K80", "P100", "V100-16GB"}
    assert (frame.throughput > 0).all()


def test_leave_one_job_type_out_beats_same_time_everywhere():
    result = cached_json("runtime-evaluate-transfer", evaluate_transfer)  # by code and data
    naive = result["same time everywhere"]
    ours = result["per-pair log-linear (ours)"]
    assert ours["n"] == 26 * 6
    assert ours["avg_rel_err"] < 0.5 * naive["avg_rel_err"]
    assert ours["p95_rel_err"] < 0.5 * naive["p95_rel_err"]


def test_transfer_direction_and_unseen_types():
    model = RuntimeTransfer().fit(load_gavel_isolated())
    times = model.predict_all({"K80": 3600.0}, ["K80", "P100", "V100-16GB", "A100-80GB", "H100"])
    assert times["K80"] == 3600.0
    assert times["K80"] > times["P100"] > times["V100-16GB"] > times["A100-80GB"] > times["H100"]
    both = model.predict_runtime({"K80": 3600.0, "P100": 1000.0}, "V100-16GB")
    assert 0 < both < 1000.0
    with pytest.raises(ValueError):
        model.predict_runtime({"K80": 0.0}, "P100")
