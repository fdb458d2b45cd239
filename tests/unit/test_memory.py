import contextlib
import io
import json
import math
import os

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from conftest import cached_json
from slurm_gpushare.cli import main
from slurm_gpushare.core.config import GpuType
from slurm_gpushare.predict.datasets import load_schedtune
from slurm_gpushare.predict.estimators import CrossTypeMemoryPredictor
from slurm_gpushare.predict.memory import (_huber_line, conformal_upper,
                                           default_predictor, estimate_memory,
                                           observations_from_schedtune)
from slurm_gpushare.predict.persist import load_predictor, save_predictor
from slurm_gpushare.predict.evaluate import render
from slurm_gpushare.core.policy import JobEstimate

CLUSTER = [GpuType("v100", 16, model="V100-16GB"), GpuType("a100", 80, model="A100-80GB")]


@pytest.fixture(scope="module")
def evaluation():
    """One full evaluation through the CLI (the figures bench/memory_eval.json records).

    It costs ~25 s, so its result is kept in .cache/ (``conftest.cached_json``): any change
    to the predictors' code or data recomputes it."""
    argv = ["memory", "evaluate", "--json", "--seeds", "1"]

    def run():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = main(argv)
        assert status == 0
        return json.loads(out.getvalue())

    return cached_json("memory-evaluate", run, " ".join(argv))


def test_schedtune_rows_and_does_not_fit_labels():
    frame = load_schedtune()
    assert len(frame) == 240
    assert (~frame.fits).sum() == 18
    assert (frame[~frame.fits].peak_mib > frame[~frame.fits].usable_mib).all()
    # The labels are never training targets.
    assert len(observations_from_schedtune(frame)) == 222


def test_estimator_conventions():
    model = CrossTypeMemoryPredictor(coverage=0.9, random_state=3)
    assert clone(model).get_params()["coverage"] == 0.9
    with pytest.raises(NotFittedError):
        model.predict_peak({"V100-16GB": 4000}, "RTX3090")
    with pytest.raises(TypeError):
        CrossTypeMemoryPredictor(0.9)  # keyword-only


def test_huber_line_ignores_an_outlier_and_conformal_bound():
    x = np.arange(20, dtype=float)
    y = 3 + 2 * x
    y[5] += 500
    assert _huber_line(x, y, 1.345) == pytest.approx([3, 2], abs=0.05)
    residuals = np.linspace(-0.1, 0.2, 30)
    assert conformal_upper(residuals, 1.0) == pytest.approx(0.2)
    assert conformal_upper(residuals, 0.5) < 0.1
    assert conformal_upper([-0.3, -0.2], 1.0) == 0.0


def test_privacy_preserving_lomo_figures(evaluation):
    table = evaluation["privacy_preserving_lomo"]
    naive, ours = table["naive RF (peak_A, specs_A, specs_B)"], table["ours, 1 observed type"]
    assert ours["n"] == naive["n"] == 840
    assert ours["avg_rel_err"] < 0.8 * naive["avg_rel_err"]
    assert ours["p95_rel_err"] < 0.8 * naive["p95_rel_err"]
    # More observed types, better estimates; with all four the average meets 3%.
    assert (table["ours, 4 observed types"]["avg_rel_err"]
            < table["ours, 2 observed types"]["avg_rel_err"] < ours["avg_rel_err"])
    assert table["ours, 4 observed types"]["avg_rel_err"] <= 0.03


def test_margin_prevents_ooms_on_held_out_rows(evaluation):
    oom = evaluation["oom_safety"]
    assert oom["all"]["oom_misses_shards"] == 0
    assert oom["all"]["misses_mib"] / oom["all"]["n"] < 0.03
    assert oom["all"]["median_over_allocation"] <= 0.15
    assert oom["does_not_fit_detected"] == 1.0 and oom["does_not_fit_cases"] > 0
    margins = [oom["by_history"][f"{k} observed type{'s' if k > 1 else ''}"]["median_margin"]
               for k in (1, 2, 3, 4)]
    assert margins == sorted(margins, reverse=True)
    assert oom["by_history"]["observed on the target type"]["median_margin"] < margins[-1]


def test_schedtune_replication_table(evaluation):
    rep = evaluation["schedtune_replication"]
    assert {"random forest", "linear regression", "SVR (RBF)", "gradient boosting",
            "MLP", "k-nearest neighbours"} <= set(rep)
    forest = rep["random forest"]
    assert forest["leave_one_model_out"]["n"] == 222
    assert forest["random_split"]["avg_rel_err"] < forest["leave_one_model_out"]["avg_rel_err"]
    text = render(evaluation)
    for title in ("SchedTune replication", "Privacy-preserving", "OOM safety",
                  "Run-time transfer", "SchedTune paper, random forest"):
        assert title in text


def test_history_on_one_type_sizes_a_share_for_another():
    verdict = estimate_memory({"v100": [9000.0, 9200.0]}, CLUSTER, default_predictor())
    assert verdict.known and verdict.source == "history"
    v100, a100 = verdict.per_type["v100"], verdict.per_type["a100"]
    assert v100.predicted_mib == 9200.0 and v100.margin == pytest.approx(0.05)
    assert v100.shards == math.ceil(9200 * 1.05 / 1024)
    assert a100.fits and a100.margin > v100.margin  # cross-type (and unseen type) margin
    estimate = verdict.job_estimate(runtime_s={"v100": 100.0})
    assert isinstance(estimate, JobEstimate)
    assert set(estimate.memory_mib) == {"v100", "a100"}
    assert estimate.detail.startswith("peak 9.0 GiB on V100-16GB")


def test_type_where_the_safe_estimate_exceeds_memory_is_excluded():
    verdict = estimate_memory({"a100": 15500.0}, CLUSTER, default_predictor())
    assert set(verdict.safe_mib) == {"a100"}
    assert "exceeds" in verdict.excluded["v100"]
    assert verdict.job_estimate().memory_mib.keys() == {"a100"}


def test_preallocating_framework_is_unknown_unless_hinted():
    verdict = estimate_memory({"v100": 16000.0}, CLUSTER, default_predictor())
    assert not verdict.known and "pre-allocates" in verdict.reason
    assert verdict.job_estimate() is None
    hinted = estimate_memory({"v100": 16000.0}, CLUSTER, default_predictor(), hint_mib=6144)
    assert hinted.known and hinted.source == "hint"
    assert hinted.safe_mib["v100"] == pytest.approx(6144 * 1.1)
    with pytest.raises(ValueError):
        estimate_memory({"v100": -1.0}, CLUSTER, default_predictor())


def test_persistence_is_atomic_json_with_metadata(tmp_path):
    data = observations_from_schedtune(load_schedtune())
    model = CrossTypeMemoryPredictor.from_dict(default_predictor().to_dict())  # = its fit
    path = tmp_path / "models" / "memory.json"
    meta = save_predictor(model, path, training_data=data, metrics={"avg_rel_err": 0.04})
    loaded, stored = load_predictor(path)
    assert stored == meta and len(stored["data_sha256"]) == 64 and stored["n_rows"] == 222
    assert stored["sklearn_version"] and stored["metrics"]["avg_rel_err"] == 0.04
    assert json.loads(path.read_text())["metadata"] == meta
    assert sorted(os.listdir(path.parent)) == ["memory.json", "memory.json.lock"]
    for query, target in (({"V100-16GB": 5000.0}, "RTX3090"), ({"K80": 9000.0}, "T4")):
        assert loaded.predict_peak(query, target) == model.predict_peak(query, target)
    with pytest.raises(NotFittedError):
        save_predictor(CrossTypeMemoryPredictor(), tmp_path / "unfitted.json")


def test_an_earlier_versions_pickled_model_is_still_read(tmp_path, monkeypatch):
    """``memory.pkl`` as versions before the JSON model wrote it (a pickle of the estimator
    class then defined in predict/memory.py): read without scikit-learn, predicting the same."""
    import pickle

    from slurm_gpushare.predict import memory

    fitted = CrossTypeMemoryPredictor.from_dict(default_predictor().to_dict())

    class Legacy:  # pickled under the old estimator's module and name
        pass

    Legacy.__module__, Legacy.__qualname__ = "slurm_gpushare.predict.memory", "CrossTypeMemoryPredictor"
    old = Legacy()
    old.__dict__.update({**fitted.get_params(), "types_": fitted.types_, "pairs_": fitted.pairs_,
                         "margins_": fitted.margins_, "margin_by_count_": fitted.margin_by_count_,
                         "n_jobs_": fitted.n_jobs_, "_sklearn_version": "1.5.2",
                         "calibration_residuals_": {("K80", "T4"): np.array([0.01, -0.02])}})
    monkeypatch.setattr(memory, "CrossTypeMemoryPredictor", Legacy, raising=False)
    path = tmp_path / "memory.pkl"
    path.write_bytes(pickle.dumps({"metadata": {"n_rows": 222}, "estimator": old}))
    monkeypatch.undo()
    loaded, metadata = load_predictor(path)
    assert metadata == {"n_rows": 222} and type(loaded) is memory.MemoryModel
    for query, target in (({"V100-16GB": 5000.0}, "RTX3090"), ({"K80": 9000.0}, "T4")):
        assert loaded.predict_peak(query, target) == fitted.predict_peak(query, target)


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    import pickle

    class Payload:  # unpickled, it would call os.system
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    path = tmp_path / "memory.pkl"
    path.write_bytes(pickle.dumps({"metadata": {}, "estimator": Payload()}))
    with pytest.raises(pickle.UnpicklingError, match="never holds"):
        load_predictor(path)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("seeds", ["0", "-1"])
def test_cli_evaluate_needs_a_split(capsys, seeds):
    assert main(["memory", "evaluate", "--seeds", seeds]) != 0
    err = capsys.readouterr().err.strip()
    assert "--seeds" in err and "\n" not in err


@pytest.mark.parametrize("broken", ["schedtune/model_stats.csv",
                                    "gavel/DERIVED_gavel_isolated_throughputs.csv"])
def test_cli_evaluate_names_a_data_file_it_cannot_read(capsys, tmp_path, broken):
    # A data directory with one file that is not UTF-8 text: one line naming that file.
    import shutil

    from slurm_gpushare.predict.datasets import default_data_dir

    source = default_data_dir()
    if not (source / "schedtune").is_dir():
        pytest.skip("public data sets not found")
    data = tmp_path / "data"
    shutil.copytree(source, data, ignore=shutil.ignore_patterns("traces"))
    if not (data / broken).exists():
        pytest.skip(f"{broken} not in this copy of the data sets")
    (data / broken).write_bytes(b"\xff\xfe\x00 not text")
    assert main(["memory", "evaluate", "--data", str(data), "--seeds", "1"]) != 0
    err = capsys.readouterr().err.strip()
    assert str(data / broken) in err and "UTF-8" in err and "\n" not in err, err


def test_cli_predict(capsys):
    assert main(["memory", "predict", "--observed", "v100-16gb:9000", "--target", "A100-80GB",
                 "--target", "RTX3090", "--target", "T4"]) == 0
    out = capsys.readouterr().out
    assert "Predicted peak GPU memory" in out and "RTX3090" in out
    assert main(["memory", "predict", "--observed", "V100-16GB:9000", "--target", "RTX3070",
                 "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["known"] and answer["types"][0]["fits"] is False  # 8 GiB card


@pytest.mark.parametrize("argv,message", [
    (["--observed", "v100"], "TYPE:PEAK_MIB"),
    (["--observed", "v100:-5"], "TYPE:PEAK_MIB"),
    (["--observed", "voodoo:5000"], "unknown GPU model"),
    (["--observed", "a100:5000"], "ambiguous"),
    (["--observed", "V100-16GB:1e30"], "TYPE:PEAK_MIB"),
    (["--observed", "V100-16GB:9000", "--hint-mib", "-5"], "--hint-mib must be a positive number"),
    (["--observed", "V100-16GB:9000", "--hint-mib", "nan"], "--hint-mib must be a positive number"),
    (["--observed", "V100-16GB:9000", "--hint-mib", "inf"], "--hint-mib must be a positive number"),
])
def test_cli_predict_bad_input(capsys, argv, message):
    assert main(["memory", "predict", *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_gpu_the_catalogue_lacks_is_sized_from_its_own_runs_and_nothing_breaks():
    # A site with a GPU newer than the catalogue (configured as [gpu_types.b200]): a job's runs
    # on it (NVML calls it "NVIDIA B200") size its share there; no transfer to or from other
    # types is predicted for it, and the other types still are.
    from slurm_gpushare.predict.history import config_type_of
    from slurm_gpushare.core.config import parse_config

    types = [GpuType("b200", 180), GpuType("a100", 80, model="A100-80GB")]
    verdict = estimate_memory({"NVIDIA B200": [20000.0]}, types, default_predictor())
    assert verdict.known and verdict.per_type["b200"].fits
    assert verdict.per_type["b200"].predicted_mib == 20000.0
    assert not verdict.per_type["a100"].fits  # nothing known to carry its runs over
    both = estimate_memory({"NVIDIA B200": [20000.0], "NVIDIA A100-SXM4-80GB": [9000.0]},
                           types, default_predictor())
    assert both.per_type["a100"].fits and both.per_type["b200"].fits
    # A run on a GPU neither the catalogue nor the configuration knows says nothing.
    none = estimate_memory({"NVIDIA X999": [5000.0]}, types, default_predictor())
    assert not none.known
    # A hint sizes the share on every type, the new one included.
    hinted = estimate_memory({}, types, default_predictor(), hint_mib=10000)
    assert hinted.per_type["b200"].fits and hinted.per_type["a100"].fits
    config = parse_config({"gpu_types": {"b200": {"memory_gib": 180}}})
    assert config_type_of("NVIDIA B200", config) == "b200"
