"""The report's figures stay the same when its parsing and aggregation get faster: the JSON
report of a synthetic site month (bench/report_scale.py's generator: shares, whole GPUs,
arrays, het jobs, requeues, 22.05 and 24.11 TRES spellings) against the digest the earlier,
row-by-row code gave for the same input (commit 6479ceb)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

from conftest import bench_module
from slurm_gpushare.cli.report import write_json
from slurm_gpushare.reports.savings import build_report
from slurm_gpushare.slurm.accounting import ingest

# sha256 of the JSON report (less "generated" and "source") of 3,000 job rows, seed 7, by
# account and by user, from commit 6479ceb's code.
EXPECTED = {
    "account": "239b13abaadb7e815e8450535b980f0e96ae933c0c1ac590fcd5e5975df88846",
    "user": "5385612f75bbc65f9305651c041fb4c566f0e68ada381c008c1f4bd12a04a408",
}


def _generator():
    return bench_module("report_scale")


def figures_digest(tmp_path: Path, by: str) -> str:
    bench = _generator()
    path = tmp_path / "sacct.psv"
    if not path.exists():
        bench.generate(path, 3000, seed=7)
    since, until = bench.WINDOW_END - bench.WINDOW_S - 86400, bench.WINDOW_END
    ingested = ingest(since, until, sacct_file=path, node_types={}, progress=False)
    report = build_report(ingested.jobs, since=since, until=until, by=by)
    report.pop("generated")
    report.pop("source")
    written = io.StringIO()  # what --format json writes, piece by piece
    write_json(report, written)
    assert json.loads(written.getvalue()) == json.loads(json.dumps(report))
    figures = json.loads(written.getvalue())
    for rows in figures.values():  # fields added since 6479ceb (none set on this input)
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and row.pop("peak_source", None) is not None:
                raise AssertionError("a peak source on input without GPU accounting")
    return hashlib.sha256(json.dumps(figures, sort_keys=True).encode()).hexdigest()


def test_report_figures_match_the_row_by_row_code(tmp_path):
    assert {by: figures_digest(tmp_path, by) for by in EXPECTED} == EXPECTED


def test_progress_goes_to_stderr_and_json_stays_clean(tmp_path, monkeypatch, capsys):
    from slurm_gpushare.cli import main

    bench = _generator()
    path = tmp_path / "sacct.psv"
    bench.generate(path, 300, seed=3)
    monkeypatch.setenv("GPUSHARE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))  # no GPU types from Slurm
    monkeypatch.setattr("slurm_gpushare.slurm.accounting.query_node_gpu_types", lambda: {})
    assert main(["report", "--sacct-file", str(path), "--progress", "--format", "json",
                 "--since", str(bench.WINDOW_END - bench.WINDOW_S - 86400),
                 "--until", str(bench.WINDOW_END)]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["totals"]["gpu_jobs"] > 100 and "reading sacct" not in out.out


def test_lazy_job_rows_write_what_the_lists_write(tmp_path):
    """``--format json`` reads the job rows lazily and writes each pre-sorted row without
    sorting, a shared job's text once for both lists: the same text as the plain lists."""
    bench = _generator()
    path = tmp_path / "sacct.psv"
    bench.generate(path, 400, seed=5)
    since, until = bench.WINDOW_END - bench.WINDOW_S - 86400, bench.WINDOW_END
    jobs = ingest(since, until, sacct_file=path, node_types={}, progress=False).jobs
    for anonymise in (False, True):
        texts = []
        for lazy in (False, True, True):  # a lazy report written twice: the same again
            report = build_report(jobs, since=since, until=until, anonymise=anonymise,
                                  lazy_rows=lazy)
            report.pop("generated")
            written = io.StringIO()
            write_json(report, written)
            if lazy:
                write_json(report, io.StringIO())
                written = io.StringIO()
                write_json(report, written)
            texts.append(written.getvalue())
        assert texts[0] == texts[1] == texts[2] and '"shared_jobs": [' in texts[0]
        row = report["jobs"][0]
        assert list(row) == sorted(row) and ("user" in row) != anonymise


def test_lazy_job_rows_write_empty_lists():
    """A window without (shared) jobs: the lazy rows are written as the empty lists."""
    texts = []
    for lazy in (False, True):
        report = build_report([], since=0, until=86400, lazy_rows=lazy)
        report.pop("generated")
        written = io.StringIO()
        write_json(report, written)
        texts.append(written.getvalue())
    assert texts[0] == texts[1] and json.loads(texts[1])["jobs"] == []
