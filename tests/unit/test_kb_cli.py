"""The classes / kb commands, including the exact ``kb predict-pairs`` interface."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpushare.cli import kb as kb_cli
from slurm_gpushare.daemon.store import Store

PROFILES = """job,gpu_util_pct,mem_util_pct,mem_used_mib,mem_total_mib,gpu_type
heavy,95,55,9000,16384,v100
light,5,1,1500,16384,v100
medium,60,25,8000,16384,v100
"""


def run(*args, env=None):
    runner = CliRunner()
    groups = {g.name: g for g in kb_cli.commands}
    return runner.invoke(groups[args[0]], list(args[1:]), env=env, catch_exceptions=False)


@pytest.fixture
def profiles(tmp_path):
    path = tmp_path / "profiles.csv"
    path.write_text(PROFILES)
    return path


@pytest.fixture(autouse=True)
def no_site_model(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSHARE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("GPUSHARE_CLASSES_MODEL", raising=False)


def test_predict_pairs_csv_interface(profiles):
    result = run("kb", "predict-pairs", str(profiles))
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == "job_a,job_b,pred_speed_a,pred_speed_b,fits_memory,recommended"
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert [(r["job_a"], r["job_b"]) for r in rows] == [
        ("heavy", "heavy"), ("heavy", "light"), ("heavy", "medium"), ("light", "light"),
        ("light", "medium"), ("medium", "medium")]
    fits = {(r["job_a"], r["job_b"]): r["fits_memory"] for r in rows}
    assert fits[("heavy", "heavy")] == "false" and fits[("light", "light")] == "true"
    assert fits[("heavy", "medium")] == "false" and fits[("heavy", "light")] == "true"
    for r in rows:
        a, b = float(r["pred_speed_a"]), float(r["pred_speed_b"])
        assert 0 < a <= 1 and 0 < b <= 1
        assert r["recommended"] in ("true", "false")
        if r["fits_memory"] == "false":
            assert r["recommended"] == "false"
    by_pair = {(r["job_a"], r["job_b"]): r for r in rows}
    # A heavier partner never predicts a faster job.
    assert float(by_pair[("heavy", "light")]["pred_speed_b"]) <= float(
        by_pair[("light", "medium")]["pred_speed_a"]) <= float(
        by_pair[("light", "light")]["pred_speed_a"])
    assert by_pair[("light", "light")]["recommended"] == "true"


def test_predict_pairs_json_matches_csv(profiles):
    rows = json.loads(run("kb", "predict-pairs", str(profiles), "--json").output)
    text = list(csv.DictReader(io.StringIO(run("kb", "predict-pairs", str(profiles)).output)))
    assert len(rows) == 6 and rows[2]["fits_memory"] is False
    assert [str(r["pred_speed_a"]) for r in rows] == [r["pred_speed_a"] for r in text]


def test_predict_pairs_learns_from_co_runs(profiles, tmp_path):
    coruns = tmp_path / "coruns.csv"
    coruns.write_text("job_a,job_b,speed_a,speed_b\nlight,medium,0.3,0.95\n"
                      "light,light,0.35,0.35\n")
    cold = {(r["job_a"], r["job_b"]): r for r in
            json.loads(run("kb", "predict-pairs", str(profiles), "--json").output)}
    warm = {(r["job_a"], r["job_b"]): r for r in json.loads(
        run("kb", "predict-pairs", str(profiles), "--co-runs", str(coruns), "--json").output)}
    # light suffers far more than the prior says: learned, and carried to its other partners.
    assert warm[("light", "light")]["pred_speed_a"] < cold[("light", "light")]["pred_speed_a"]
    assert warm[("heavy", "light")]["pred_speed_b"] < cold[("heavy", "light")]["pred_speed_b"]
    assert warm[("light", "light")]["recommended"] is False


def test_predict_pairs_reads_files_saved_by_a_spreadsheet(profiles, tmp_path):
    # Spreadsheets save CSV as UTF-8 with a byte-order mark and CRLF line ends: the same rows.
    coruns = "job_a,job_b,speed_a,speed_b\nlight,medium,0.3,0.95\n"
    saved = tmp_path / "saved.csv"
    saved.write_bytes(b"\xef\xbb\xbf" + PROFILES.replace("\n", "\r\n").encode())
    saved_coruns = tmp_path / "saved_coruns.csv"
    saved_coruns.write_bytes(b"\xef\xbb\xbf" + coruns.replace("\n", "\r\n").encode())
    plain_coruns = tmp_path / "coruns.csv"
    plain_coruns.write_text(coruns)
    plain = run("kb", "predict-pairs", str(profiles), "--co-runs", str(plain_coruns))
    result = run("kb", "predict-pairs", str(saved), "--co-runs", str(saved_coruns))
    assert result.exit_code == 0 and result.output == plain.output


def test_predict_pairs_optional_peaks(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("job,gpu_util_pct,mem_util_pct,mem_used_mib,mem_total_mib,gpu_type,"
                    "gpu_util_max_pct,mem_util_max_pct\nx,10,5,1000,16384,,90,40\n")
    rows = json.loads(run("kb", "predict-pairs", str(path), "--json").output)
    assert [(r["job_a"], r["job_b"]) for r in rows] == [("x", "x")]


def test_predict_pairs_takes_a_blank_utilisation_as_not_measured(tmp_path):
    # A set without memory-controller figures (or only peaks of SM use) leaves those blank:
    # predicted as the model does without them (docs: predict/pairs.py), not refused.
    path = tmp_path / "p.csv"
    path.write_text("job,gpu_util_pct,mem_util_pct,mem_used_mib,mem_total_mib,gpu_type,"
                    "gpu_util_max_pct\nx,60,,1000,16384,v100,\ny,,10,1000,16384,v100,80\n")
    rows = json.loads(run("kb", "predict-pairs", str(path), "--json").output)
    from slurm_gpushare.predict.pairs import default_model

    expected = default_model().predict_group(
        [{"gpu_util_pct": 60}, {"gpu_util_max_pct": 80, "mem_util_pct": 10}])
    by_pair = {(r["job_a"], r["job_b"]): r for r in rows}
    assert (by_pair[("x", "y")]["pred_speed_a"], by_pair[("x", "y")]["pred_speed_b"]) == (
        round(expected[0], 4), round(expected[1], 4))


def test_predict_pairs_takes_a_blank_memory_figure_as_unknown(tmp_path):
    # Whether the pair fits is then unknown (blank), and the pair is judged by speed alone.
    path = tmp_path / "p.csv"
    path.write_text(PROFILES + "nomem,5,1,,16384,v100\nnototal,5,1,1000,,v100\n")
    rows = list(csv.DictReader(io.StringIO(run("kb", "predict-pairs", str(path)).output)))
    by_pair = {(r["job_a"], r["job_b"]): r for r in rows}
    assert len(rows) == 5 * 6 // 2  # no pair missing
    assert by_pair[("nomem", "nomem")]["fits_memory"] == ""
    assert by_pair[("heavy", "nototal")]["fits_memory"] == ""
    assert by_pair[("light", "nomem")]["recommended"] == "true"  # two light jobs
    assert by_pair[("heavy", "light")]["fits_memory"] == "true"


def test_co_runs_of_jobs_without_a_profile_are_left_out_with_one_warning(profiles, tmp_path):
    from slurm_gpushare.cli import main
    import contextlib

    known = "job_a,job_b,speed_a,speed_b\nheavy,medium,0.55,0.7\n"
    with_unknown = known + "heavy,nobody,0.5,0.5\nghost,nobody,0.9,0.9\n"
    (tmp_path / "known.csv").write_text(known)
    (tmp_path / "unknown.csv").write_text(with_unknown)
    outputs = []
    for name in ("known.csv", "unknown.csv"):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            assert main(["kb", "predict-pairs", str(profiles), "--co-runs",
                         str(tmp_path / name)]) == 0
        outputs.append((out.getvalue(), err.getvalue()))
    assert outputs[0][0] == outputs[1][0]  # learned from the same co-run
    assert outputs[0][1] == ""
    warning = outputs[1][1].strip().splitlines()
    assert len(warning) == 1 and "2 co-run(s) left out: 2 job(s) without a profile " \
        "('nobody', 'ghost')" in warning[0]


def test_speeds_of_zero_and_above_one_are_measurements(profiles, tmp_path):
    # No progress next to the partner, and noise above 1: learned from (clipped), not refused.
    coruns = tmp_path / "c.csv"
    coruns.write_text("job_a,job_b,speed_a,speed_b\nheavy,medium,0,1.8\nlight,light,1.2,\n")
    result = run("kb", "predict-pairs", str(profiles), "--co-runs", str(coruns), "--json")
    rows = {(r["job_a"], r["job_b"]): r for r in json.loads(result.output)}
    cold = {(r["job_a"], r["job_b"]): r
            for r in json.loads(run("kb", "predict-pairs", str(profiles), "--json").output)}
    assert rows[("heavy", "medium")]["pred_speed_a"] < cold[("heavy", "medium")]["pred_speed_a"]
    assert rows[("heavy", "medium")]["recommended"] is False


@pytest.mark.parametrize("content, message", [
    ("job,gpu_util_pct\nx,1\n",
     "missing column(s) mem_util_pct, mem_used_mib, mem_total_mib, gpu_type"),
    (PROFILES.replace("95,55", "lots,55"), "line 2: gpu_util_pct is not a number"),
    (PROFILES.replace("95,55", "195,55"), "line 2: gpu_util_pct must be a number between 0 and 100"),
    (PROFILES.replace(",16384,v100\nlight", ",0,v100\nlight"), "line 2: mem_total_mib must be > 0"),
    (PROFILES + "heavy,1,1,1,16384,v100\n", "line 5: job heavy appears twice"),
    (PROFILES + "idle,,,1,16384,v100\n",
     "line 5: gpu_util_pct is blank, and so are mem_util_pct and the peaks"),
    (PROFILES + "nomem,5,1,lots,16384,v100\n", "line 5: mem_used_mib is not a number"),
    (PROFILES + "nomem,5,1,-1,16384,v100\n", "line 5: mem_used_mib must be a non-negative number"),
])
def test_predict_pairs_errors_are_one_line(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    from slurm_gpushare.cli import main
    import contextlib

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["kb", "predict-pairs", str(path)]) == 1
    assert message in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1


@pytest.mark.parametrize("content, message", [
    ("job_a,job_b,speed_a\nheavy,light,0.5\n", "missing column(s) speed_b"),
    ("job_a,job_b,speed_a,speed_b\nheavy,light,fast,0.5\n", "line 2: speed_a is not a number"),
    ("job_a,job_b,speed_a,speed_b\nheavy,light,-0.1,0.5\n",
     "line 2: speed_a must be a non-negative number"),
    ("job_a,job_b,speed_a,speed_b\nheavy,light,0.9,95\n",
     "line 2: speed_b 95 is not a normalised speed (throughput shared / alone, e.g. 0.95, not 95)"),
])
def test_predict_pairs_co_run_errors_are_one_line(profiles, tmp_path, content, message):
    path = tmp_path / "coruns.csv"
    path.write_text(content)
    from slurm_gpushare.cli import main
    import contextlib

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["kb", "predict-pairs", str(profiles), "--co-runs", str(path)]) == 1
    assert message in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1


def test_classes_fit_show_and_missing_model(tmp_path):
    result = CliRunner().invoke(kb_cli.classes_group, ["show"])
    assert result.exit_code == 1 and "no class model" in result.output
    data = tmp_path / "jobs.csv"
    rows = ["mgup_max,mgmap_max_pct,mgtsamp_max"]
    rows += [f"{90 + i % 3},{60 - i % 2},{50 + i % 4}" for i in range(10)]
    rows += [f"{5 + i % 3},{4 + i % 2},{1 + i % 2}" for i in range(10)]
    data.write_text("\n".join(rows) + "\n")
    model = tmp_path / "m.json"
    fitted = run("classes", "fit", "--data", str(data), "--model", str(model), "--json")
    assert json.loads(fitted.output)["k"] == 2 and model.exists()
    shown = json.loads(run("classes", "show", "--model", str(model), "--json").output)
    assert shown["k"] == 2 and shown["centroids"][0]["MGUP"] < shown["centroids"][1]["MGUP"]


@pytest.mark.parametrize("row", ["1,1,1,1,50,1e308,50", "1,1,1,1,-50,20,10", "1,1,1,1,50,500,10"])
def test_classes_fit_refuses_features_that_are_no_percentages(tmp_path, capsys, row):
    from slurm_gpushare.cli import main
    from slurm_gpushare.predict.datasets import package_path

    records = package_path("alnair", "clustering_record_175.csv").read_text().splitlines()
    data = tmp_path / "records.csv"
    data.write_text("\n".join([records[0], row, *records[1:50]]) + "\n")
    model = tmp_path / "m.json"
    assert main(["classes", "fit", "--data", str(data), "--model", str(model)]) == 1
    err = capsys.readouterr().err.strip()
    assert "between 0 and 100" in err and "\n" not in err and not model.exists()


def test_classes_fit_from_store(tmp_path):
    with Store(tmp_path / "s.db") as store:
        for i in range(12):
            load = 90 if i % 2 else 5
            store.ingest_summary({"job_id": str(i), "gpu_index": 0, "mgup_max": load + i % 3,
                                  "mgmap_max_pct": load / 2, "mgtsamp_max": load / 3 + i % 2})
    result = run("classes", "fit", "--store", str(tmp_path / "s.db"), "--model",
                 str(tmp_path / "m.json"), "--json")
    assert json.loads(result.output)["k"] == 2


def test_reproduce_reports_the_comparison():
    result = json.loads(run("classes", "reproduce", "--json").output)
    assert result["k"] == 3 and len(result["jobs"]) == 12
    text = run("classes", "reproduce").output
    assert "adjusted Rand index" in text and "contingency" in text


def test_kb_show_with_store(tmp_path):
    seeded = json.loads(run("kb", "show", "--json").output)
    assert sum(p["count"] for p in seeded["pairs"]) == 34
    with Store(tmp_path / "s.db") as store:
        store.record_corun("1", "2", class_a=0, class_b=0, isd_a=2.0, isd_b=2.0,
                           gpu_type="v100")
    learned = json.loads(run("kb", "show", "--store", str(tmp_path / "s.db"), "--gpu-type",
                             "v100", "--json").output)
    cell = next(p for p in learned["pairs"] if (p["class_a"], p["class_b"]) == (0, 0))
    assert cell["source"] == "gpu" and cell["compatible"] is False


@pytest.mark.parametrize("argv", [["kb", "show"], ["classes", "fit"]])
@pytest.mark.parametrize("content", [b"", b"not a database, a text file\n"])
def test_a_store_that_is_not_one_is_refused_and_left_as_it_was(tmp_path, capsys, argv, content):
    from slurm_gpushare.cli import main

    path = tmp_path / "store.db"
    path.write_bytes(content)
    extra = ["--model", str(tmp_path / "m.json")] if argv[0] == "classes" else []
    assert main([*argv, "--store", str(path), *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert str(path) in err and "\n" not in err
    assert path.read_bytes() == content  # not turned into an empty store


@pytest.mark.parametrize("argv", [["classes", "show"], ["kb", "show"]])
@pytest.mark.parametrize("content", [None, "[]\n", "null\n"])
def test_a_model_path_that_holds_no_model_is_a_one_line_error_and_gets_no_lock_file(
        tmp_path, capsys, argv, content):
    from slurm_gpushare.cli import main

    path = tmp_path / "data.json"
    if content is not None:
        path.write_text(content)
    status = main([*argv, "--model", str(path)])
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and (status != 0 or argv[0] == "kb")
    # Reading never leaves <path>.lock beside a file it was only asked to read.
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if content is None else ["data.json"])


def test_commands_are_registered_in_the_main_cli():
    import click

    from slurm_gpushare.cli import cli

    ctx = click.Context(cli)
    assert {"classes", "kb"} <= set(cli.list_commands(ctx))
    assert {"fit", "show", "reproduce"} <= set(cli.get_command(ctx, "classes").commands)
    assert {"show", "predict-pairs", "evaluate"} <= set(cli.get_command(ctx, "kb").commands)


def test_the_daemon_loads_the_classes_that_classes_fit_wrote(tmp_path):
    from conftest import RunningDaemon, make_config

    config = make_config(tmp_path)
    data = tmp_path / "jobs.csv"
    rows = ["mgup_max,mgmap_max_pct,mgtsamp_max"]
    rows += [f"{90 + i % 3},{60 - i % 2},{50 + i % 4}" for i in range(10)]
    rows += [f"{5 + i % 3},{4 + i % 2},{1 + i % 2}" for i in range(10)]
    data.write_text("\n".join(rows) + "\n")
    model = Path(config.daemon.state_dir) / "classes.json"
    run("classes", "fit", "--data", str(data), "--model", str(model), "--k", "2")
    running = RunningDaemon(config)
    try:
        assert running.service.estimator.classes.k == 2  # not the packaged k = 3
    finally:
        running.stop()


def test_kb_evaluate_prints_every_held_out_set(monkeypatch):
    # The figures are bench/pairs_eval.py's (cached here; 5 seeds take half a minute): this
    # checks the command's wiring and what it prints for each set.
    from conftest import cached_json
    from slurm_gpushare.predict import evaluate

    held_out = cached_json("pairs-leave-one-data-set-out",
                           lambda: evaluate.leave_one_data_set_out(seeds=[0]))
    monkeypatch.setattr(evaluate, "leave_one_data_set_out", lambda: held_out)
    result = run("kb", "evaluate")
    assert result.exit_code == 0, result.output
    for name in held_out:
        assert f"pair predictor, {name} held out: Spearman" in result.output
    assert "class_kb_on_alnair_paper_ids" in result.output
    as_json = json.loads(run("kb", "evaluate", "--json").output)
    assert as_json["pair_predictor_leave_one_data_set_out"].keys() == held_out.keys()


def test_utilisations_given_as_ratios_draw_a_warning(tmp_path):
    from slurm_gpushare.cli import main
    import contextlib

    ratios = tmp_path / "ratios.csv"
    ratios.write_text("job,gpu_util_pct,mem_util_pct,mem_used_mib,mem_total_mib,gpu_type\n"
                      "a,0.95,0.4,1000,16384,v100\nb,0.2,0.05,1000,16384,v100\n")
    percent = tmp_path / "percent.csv"
    percent.write_text(PROFILES)
    for path, warned in ((ratios, True), (percent, False)):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            assert main(["kb", "predict-pairs", str(path)]) == 0
        assert ("every utilisation is at most 1%" in err.getvalue()) == warned
        assert len(out.getvalue().splitlines()) == 1 + (3 if path == ratios else 6)
