"""``slurm-gpushare report`` on awkward input: a failed run loses nothing, input read twice
counts once, and every error is one line that names what was wrong."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_gpushare.cli import main
from slurm_gpushare.slurm.accounting import ingest, parse_psv

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"
PSV = DATA / "awkward.psv"
WINDOW = ["--since", "2026-01-01", "--until", "1795400000", "--no-progress"]
FORMATS = ("table", "csv", "json", "html")


def report_json(capsys, sacct_file, *extra) -> dict:
    assert main(["report", "--sacct-file", str(sacct_file), *WINDOW, "--format", "json",
                 *extra]) == 0
    return json.loads(capsys.readouterr().out)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


# -- 1. a failed run leaves an existing output file as it was ------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("option", ["--since", "--until"])
def test_an_absurd_window_is_refused_and_the_output_file_kept(tmp_path, capsys, fmt, option):
    kept = tmp_path / "k.txt"
    kept.write_text("KEEP\n")
    window = {"--since": "-99999999d", "--until": "99999999999999999"}
    args = ["report", "--sacct-file", str(PSV), "--no-progress", "--format", fmt,
            "-o", str(kept), option, window[option]]
    if option == "--until":
        args += ["--since", "2026-01-01"]
    assert main(args) != 0
    assert f"for {option}:" in one_line_error(capsys)
    assert kept.read_text() == "KEEP\n" and os.listdir(tmp_path) == ["k.txt"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_rendering_failure_leaves_the_output_file_untouched(tmp_path, capsys, monkeypatch,
                                                              fmt):
    """Whatever fails half-way through writing, the old file stays and no temporary is left."""
    from slurm_gpushare.cli import report

    def fail(report_, out=None):
        if out is not None:
            (out.print if fmt == "table" else out.write)("half a report")
        raise RuntimeError("renderer broke")

    target = {"table": "render_table", "json": "write_json", "csv": "render_csv"}
    if fmt == "html":
        monkeypatch.setattr("slurm_gpushare.reports.html.render_html", fail)
    else:
        monkeypatch.setattr(report, target[fmt], fail)
    kept = tmp_path / "k.txt"
    kept.write_text("KEEP\n")
    assert main(["report", "--sacct-file", str(PSV), *WINDOW, "--format", fmt,
                 "-o", str(kept)]) == 1
    assert "renderer broke" in one_line_error(capsys)
    assert kept.read_text() == "KEEP\n" and os.listdir(tmp_path) == ["k.txt"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_output_file_is_replaced_whole_with_the_usual_permissions(tmp_path, capsys, fmt):
    """A new file gets the mode open() would give it (a web server reads savings.html); an
    existing one keeps its own."""
    new, old = tmp_path / "new.out", tmp_path / "old.out"
    old.write_text("KEEP\n" * 10000)
    old.chmod(0o640)
    for target in (new, old):
        assert main(["report", "--sacct-file", str(PSV), *WINDOW, "--format", fmt,
                     "-o", str(target)]) == 0
    capsys.readouterr()
    umask = os.umask(0)
    os.umask(umask)
    assert new.stat().st_mode & 0o777 == 0o666 & ~umask
    assert old.stat().st_mode & 0o777 == 0o640
    assert "KEEP" not in old.read_text()
    assert old.read_text()[:40] == new.read_text()[:40]  # html's plot ids differ run to run
    assert sorted(os.listdir(tmp_path)) == ["new.out", "old.out"]


def test_an_unwritable_output_is_a_one_line_error_naming_it(tmp_path, capsys):
    target = tmp_path / "no-such-dir" / "r.csv"
    assert main(["report", "--sacct-file", str(PSV), *WINDOW, "--format", "csv",
                 "-o", str(target)]) == 1
    assert str(target) in one_line_error(capsys)


def test_a_bad_time_names_its_option(capsys):
    assert main(["report", "--sacct-file", str(PSV), "--since", "yesterday-ish"]) != 0
    assert "for --since:" in one_line_error(capsys)


# -- 2. a job read twice counts once ---------------------------------------------------------
def test_overlapping_exports_concatenated_count_each_job_once(tmp_path, capsys):
    lines = PSV.read_text().splitlines(keepends=True)
    dup = tmp_path / "dup.psv"
    dup.write_text("".join(lines + lines[1:]))
    once, twice = report_json(capsys, PSV), report_json(capsys, dup)
    assert twice["totals"] == once["totals"] and twice["jobs"] == once["jobs"]
    assert twice["totals"]["requeued_runs_shared"] == 0
    assert [j.to_dict() for j in parse_psv(dup.read_text())] == \
        [j.to_dict() for j in parse_psv(PSV.read_text())]


def test_a_job_read_twice_keeps_its_later_line():
    """A later export is newer: the job that was running in the first is finished in it."""
    head = "JobID|JobIDRaw|State|Submit|Start|End|AllocTRES\n"
    first = "7|7|RUNNING|100|110|Unknown|gres/gpu=1\n7.batch|7.batch|RUNNING||110|Unknown|\n"
    later = "7|7|COMPLETED|100|110|170|gres/gpu=1\n7.batch|7.batch|COMPLETED||110|170|\n"
    (job,) = parse_psv(head + first + later)
    assert job.state == "COMPLETED" and job.end == 170 and not job.earlier_runs
    # Each step line once; one whose line changed keeps both, which gives every step figure
    # (OOM, peaks) the later line alone gives.
    assert [s.state for s in job.steps] == ["RUNNING", "COMPLETED"]
    (job,) = parse_psv(head + later + later)
    assert job.state == "COMPLETED" and len(job.steps) == 1
    (job,) = parse_psv(head + "7|7|PENDING|100|Unknown|Unknown|\n" + later)
    assert job.state == "COMPLETED" and not job.earlier_runs


def test_requeued_runs_are_still_runs_when_read_twice():
    """-D lists each run of a requeued job (a requeue renews the submit time): those stay
    runs; the same run read again does not add one."""
    head = "JobID|JobIDRaw|State|Submit|Start|End|AllocTRES\n"
    runs = "9|9|REQUEUED|100|100|120|gres/gpu=1\n9|9|COMPLETED|125|130|190|gres/gpu=1\n"
    same_submit = runs.replace("|125|130|", "|100|130|")  # runs that started apart are two
    for text in (runs, runs + runs, runs.splitlines(True)[1] + runs, same_submit):
        (job,) = parse_psv(head + text)
        assert job.state == "COMPLETED" and [r.state for r in job.earlier_runs] == ["REQUEUED"]


def test_a_json_export_listing_a_job_twice_counts_it_once(tmp_path, capsys):
    data = json.loads((DATA / "awkward.json").read_text())
    data["jobs"] = data["jobs"] + data["jobs"]
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps(data))
    once = report_json(capsys, DATA / "awkward.json")
    assert report_json(capsys, dup)["totals"] == once["totals"]


def test_incremental_runs_on_overlapping_output_count_each_job_once(tmp_path):
    text = PSV.read_text()
    dup = text + "".join(text.splitlines(keepends=True)[1:])
    args = dict(state_dir=tmp_path / "state", node_types={})
    once = ingest(1.7e9, 1795400000, runner=lambda *a, **k: text, node_types={})
    first = ingest(1.7e9, 1795400000, runner=lambda *a, **k: dup, **args)
    again = ingest(1.7e9, 1795400000, runner=lambda *a, **k: dup, **args)
    finished = sum(j.finished for j in once.jobs)
    assert first.new == finished and again.new == 0
    for got in (first, again):
        assert sorted(j.job_id for j in got.jobs) == sorted(j.job_id for j in once.jobs)
        assert not any(j.earlier_runs for j in got.jobs)


# -- 3. how the file is encoded -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["awkward.psv", "awkward.json"])
def test_a_file_with_a_byte_order_mark_is_read(tmp_path, capsys, name):
    marked = tmp_path / name
    marked.write_bytes(b"\xef\xbb\xbf" + (DATA / name).read_bytes())
    assert report_json(capsys, marked)["totals"] == report_json(capsys, DATA / name)["totals"]


def test_a_file_that_is_not_utf8_is_a_one_line_error_naming_it(tmp_path, capsys):
    latin1 = tmp_path / "latin1.psv"
    latin1.write_bytes(PSV.read_bytes().replace(b"|physics|", "|physiqué|".encode("latin-1")))
    assert main(["report", "--sacct-file", str(latin1), *WINDOW]) == 1
    err = one_line_error(capsys)
    assert str(latin1) in err and "UTF-8" in err


# -- 4. a store that is not one ----------------------------------------------------------------
def test_a_store_that_is_not_a_database_is_named(tmp_path, capsys):
    bogus = tmp_path / "x.db"
    bogus.write_text("not a database\n")
    assert main(["report", "--sacct-file", str(PSV), *WINDOW, "--store", str(bogus)]) == 1
    err = one_line_error(capsys)
    assert str(bogus) in err and "not a database" in err and err.count(str(bogus)) == 1


def test_a_store_that_fails_while_read_is_named(tmp_path, capsys):
    """A database of the right schema version whose tables are gone: the query fails."""
    import sqlite3

    from slurm_gpushare.daemon.store import SCHEMA_VERSION

    broken = tmp_path / "broken.db"
    with sqlite3.connect(broken) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    assert main(["report", "--sacct-file", str(PSV), *WINDOW, "--store", str(broken)]) == 1
    err = one_line_error(capsys)
    assert f"cannot read the store {broken}: no such table" in err
