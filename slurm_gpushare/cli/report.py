"""``slurm-gpushare report``: what sharing saved, from Slurm accounting and the store.

    slurm-gpushare report                                  # last 7 days, by account, a table
    slurm-gpushare report --by class-pair --format html -o savings.html --store gpushare.db
    slurm-gpushare report --anonymise --format json        # a public summary
"""

from __future__ import annotations

import csv
import gc
import io
import json
import re
import sqlite3
import sys
import time
from datetime import datetime
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from slurm_gpushare.core.files import replacing
from slurm_gpushare.slurm.accounting import AccountingError, ingest
from slurm_gpushare.reports.savings import GROUP_BY, JobRows, build_report

DEFAULT_WINDOW_S = 7 * 86400
_RELATIVE = re.compile(r"^(?:now)?-(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(text: str, now: float, option: str | None = None) -> float:
    """``now``, ``-7d`` / ``now-12h``, epoch seconds, or an ISO date/time (local time).
    ``option``: the option it came from, named in the error."""
    text = text.strip()
    if text == "now":
        return now
    relative, moment = _RELATIVE.match(text), None
    if not relative and not re.fullmatch(r"\d{9,}(\.\d+)?", text):
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise click.BadParameter(f"{text!r}: use now, -7d, -12h, an ISO date or epoch "
                                     "seconds", param_hint=option) from None
    try:
        if relative:
            when = now - float(relative.group(1)) * _UNIT_S[relative.group(2)]
        else:
            when = float(text) if moment is None else moment.timestamp()
        datetime.fromtimestamp(when)  # sacct's window and every format show it as a date
    except (ValueError, OverflowError, OSError):
        raise click.BadParameter(f"{text!r} is out of range (years 1 to 9999)",
                                 param_hint=option) from None
    return when


def _hours(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _secs(value) -> str:
    return "-" if value is None else f"{value:.0f}s"


def isd_text(t: dict) -> str:
    """The slowdown with its uncertainty and sample size, e.g. ``median 12.0% (3.1% to 21.4%
    from sacct's 1 s times) over 8 jobs, small sample``."""
    if not t["isd_n"]:
        return "slowdown (ISD) unknown (no shared job with a solo time)"
    text = f"slowdown (ISD) median {_pct(t['isd_median'])}"
    if t["isd_median_low"] is not None:
        text += (f" ({_pct(t['isd_median_low'])} to {_pct(t['isd_median_high'])} "
                 "from sacct's 1 s times)")
    text += f", p95 {_pct(t['isd_p95'])} over {t['isd_n']} jobs"
    if t["isd_small_sample"]:
        text += ", small sample"
    if t["isd_noisy"]:
        text += f", {t['isd_noisy']} noisy"
    return text


def render_table(report: dict, console: Console) -> None:
    t = report["totals"]
    window = report["window"]
    span = (f"{datetime.fromtimestamp(window['since']):%Y-%m-%d %H:%M} to "
            f"{datetime.fromtimestamp(window['until']):%Y-%m-%d %H:%M}")
    console.print(f"[bold]GPU sharing report[/] {span} ({report['source']})")
    console.print(f"[bold]Verdict:[/] {report['verdict']}")
    console.print(
        f"{t['gpu_jobs']} GPU jobs finished ({t['shared_jobs']} on shares, "
        f"{t['exclusive_jobs']} on whole GPUs; {t['running_jobs']} still running, left out). "
        f"GPU-hours {_hours(t['gpu_hours_used'])} used instead of "
        f"{_hours(t['gpu_hours_exclusive'])} on whole GPUs: [bold]{_hours(t['gpu_hours_saved'])}"
        f" saved ({_pct(t['saved_fraction'])})[/]. Packing saving {_pct(t['ps'])}; "
        f"{isd_text(t)} (solo time from history {t['solo_from_history']}, predictor "
        f"{t['solo_from_predictor']}, unknown {t['solo_unknown']}).")
    console.print(
        f"Costs: queue wait median {_secs(t['queue_delay_shared_median_s'])} on shares vs "
        f"{_secs(t['queue_delay_exclusive_median_s'])} on whole GPUs "
        f"(extra queueing {_hours(t['extra_queue_hours'])} h); extra run time "
        f"{_hours(t['extra_run_hours'])} h; {t['slowed_jobs']} jobs slowed > 20%; "
        f"{t['overrun_shared']} outgrew their share; OOM {t['oom_shared']} shared / "
        f"{t['oom_exclusive']} whole; failed {t['failed_shared']} / {t['failed_exclusive']}; "
        f"requeued runs {t['requeued_runs_shared']} / {t['requeued_runs_exclusive']}.")
    table = Table(title=f"By {report['by']}", title_justify="left")
    for column in ("", "GPU jobs", "shared", "GPU-h used", "GPU-h whole", "GPU-h saved",
                   "PS", "ISD median", "slowed", "queue sh", "queue wh", "outgrew",
                   "OOM sh/wh", "failed sh/wh"):
        table.add_column(column, justify="left" if not column else "right")
    for row in report["rows"] + [{"key": "all", **t}]:
        table.add_row(
            row["key"], str(row["gpu_jobs"]), str(row["shared_jobs"]),
            _hours(row["gpu_hours_used"]), _hours(row["gpu_hours_exclusive"]),
            _hours(row["gpu_hours_saved"]), _pct(row["ps"]), _pct(row["isd_median"]),
            str(row["slowed_jobs"]), _secs(row["queue_delay_shared_median_s"]),
            _secs(row["queue_delay_exclusive_median_s"]), str(row["overrun_shared"]),
            f"{row['oom_shared']}/{row['oom_exclusive']}",
            f"{row['failed_shared']}/{row['failed_exclusive']}")
    console.print(table)
    shared_groups = [g for g in report["groups"] if len(g["jobs"]) > 1]
    if shared_groups:
        groups = Table(title="Co-run groups (jobs that shared a GPU)", title_justify="left")
        for column in ("GPU", "jobs", "classes", "makespan", "sum of solo", "PS",
                       "ISD per job (solo from)"):
            groups.add_column(column)
        for g in shared_groups[:50]:
            isds = ", ".join(
                f"{m['job_id']} {_pct(m['isd'])} ({m['solo_source']})" for m in g["members"])
            groups.add_row(g["gpu"], " ".join(g["jobs"]), g["class_pair"],
                           _secs(g["makespan_s"]), _secs(g["solo_sum_s"]), _pct(g["ps"]), isds)
        console.print(groups)
        if len(shared_groups) > 50:
            console.print(f"... and {len(shared_groups) - 50} more groups (--format json)")
    for note in report.get("notes", []):
        console.print(f"[dim]note: {note}[/]")
    for source, q in report["prediction"].items():
        console.print(
            f"Memory ({source}, {q['n']} shared jobs with a measured peak): predictor's "
            f"estimate (prediction + margin) vs peak {_pct(q['estimate_error_mean'])} on "
            f"average, p95 |error| {_pct(q['estimate_error_p95'])}, below the peak in "
            f"{q['estimate_below_peak']} of {q['estimate_n']}; share given / peak median "
            f"{_ratio(q['share_over_peak_median'])} (over-allocation chosen by policy), share "
            f"below the peak in {q['share_below_peak']} of {q['share_n']}.")


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


JOB_CSV_FIELDS = ("job_id", "store_id", "user", "account", "partition", "gpu_type", "on_share",
                  "state", "run_s", "queue_s", "gpu_s_used", "gpu_s_exclusive", "solo_s",
                  "solo_source", "solo_runs", "isd", "isd_low", "isd_high", "class_pair",
                  "co_runners", "share_gib", "safe_estimate_gib", "peak_gib", "oom",
                  "requeued_runs")


def render_csv(report: dict) -> str:
    """One row per group (``row=summary``, then ``all``), then one per GPU job (``row=job``)."""
    out = io.StringIO()
    rows = report["rows"] + [{"key": "all", **report["totals"]}]
    fields = ["row", report["by"]] + list(report["totals"]) + [
        f for f in JOB_CSV_FIELDS if f not in report["totals"]]
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({"row": "summary", report["by"]: row["key"],
                         **{k: v for k, v in row.items() if k != "key"}})
    for job in report["jobs"]:
        writer.writerow({"row": "job", **job, "co_runners": " ".join(job["co_runners"])})
    return out.getvalue()


def write_json(report: dict, out) -> None:
    """The report as JSON, written piece by piece (a month of a large site has a million job
    rows): keys sorted, one line per top-level key or per element of a top-level list."""
    keys = sorted(report)
    encode = json.JSONEncoder(sort_keys=True).encode  # json.dumps(..., sort_keys=True)
    out.write("{\n")
    for i, key in enumerate(keys):
        value, comma = report[key], "," if i < len(keys) - 1 else ""
        if isinstance(value, JobRows) and not value:
            value = []
        if isinstance(value, (list, JobRows)) and value:
            out.write(f"  {json.dumps(key)}: [\n")
            last = len(value) - 1
            items = value.encoded() if isinstance(value, JobRows) else map(encode, value)
            for j, text in enumerate(items):
                out.write(f"    {text}{',' if j < last else ''}\n")
            out.write(f"  ]{comma}\n")
        else:
            out.write(f"  {json.dumps(key)}: {json.dumps(value, sort_keys=True)}{comma}\n")
    out.write("}\n")


def write_report(report: dict, fmt: str, out, terminal: bool) -> None:
    """The report in ``fmt`` on the text stream ``out`` (``terminal``: standard output, where
    the table may have colours)."""
    if fmt == "table":
        render_table(report, Console(file=out, width=160,
                                     force_terminal=None if terminal else False))
    elif fmt == "json":
        write_json(report, out)
    elif fmt == "csv":
        out.write(render_csv(report))
    else:
        from slurm_gpushare.reports.html import render_html
        out.write(render_html(report))


def store_path_from_config(config_path: str | None) -> tuple[str | None, str]:
    """The daemon's store named by the config (``daemon.state_dir``/store.sqlite), and a note
    when there is none to read."""
    from slurm_gpushare.core.config import ConfigError, load_config
    from slurm_gpushare.daemon.server import STORE_FILE

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        if config_path:
            raise click.ClickException(str(exc))
        return None, f"no --store and no readable config ({exc})"
    path = Path(config.daemon.state_dir) / STORE_FILE
    if not path.is_file():
        return None, f"no store at {path} (daemon.state_dir of {config.path or 'the config'})"
    return str(path), ""


@click.command("report")
@click.option("--since", default=None, help="Start of the window (default: 7 days ago). "
                                            "now, -7d, -12h, an ISO date or epoch seconds.")
@click.option("--until", default="now", show_default=True, help="End of the window.")
@click.option("--by", "by", type=click.Choice(GROUP_BY), default="account", show_default=True,
              help="One row per value of this.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "html"]),
              default="table", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Write to this file instead of standard output.")
@click.option("--anonymise", is_flag=True,
              help="Replace user names by user-1, user-2, ... (for a public summary).")
@click.option("--sacct-file", type=click.Path(dir_okay=False), default=None,
              help="Read recorded sacct output (-P with a header, or --json) instead of "
                   "running sacct.")
@click.option("--sacct-json", is_flag=True, help="Ask sacct for --json instead of -P.")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), default=None,
              help="The daemon's store (SQLite): decisions, telemetry, co-runs.")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="Keep ingested jobs here and ask sacct only for new ones next time.")
@click.option("--progress/--no-progress", default=None,
              help="A progress bar on standard error while sacct's output is read (default: "
                   "only for large inputs with standard error on a terminal).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Config naming the store when --store is not given (default: "
                   "$GPUSHARE_CONFIG or the default path).")
def report_command(since, until, by, fmt, output, anonymise, sacct_file, sacct_json,
                   store_path, state_dir, progress, config_path) -> None:
    """Report what GPU sharing saved (packing saving, slowdowns, GPU-hours) and cost."""
    now = time.time()
    stop = parse_when(until, now, "--until")
    start = parse_when(since, now, "--since") if since else stop - DEFAULT_WINDOW_S
    if start >= stop:
        raise click.ClickException("--since must be before --until")
    store, missing_store = None, ""
    if not store_path:
        store_path, missing_store = store_path_from_config(config_path)
    if store_path:
        if not Path(store_path).is_file():
            raise click.ClickException(f"no store at {store_path}")
        from slurm_gpushare.daemon.store import Store, StoreError
        try:
            store = Store(store_path, readonly=True)
        except StoreError as exc:  # "<path>: why"
            raise click.ClickException(f"cannot open the store {exc}")
        except (OSError, sqlite3.Error) as exc:
            raise click.ClickException(f"cannot open the store {store_path}: {exc}")
    try:
        ingested = ingest(start, stop, sacct_file=sacct_file, state_dir=state_dir,
                          as_json=sacct_json, progress=progress)
        report = build_report(ingested.jobs, since=start, until=stop, by=by, store=store,
                              anonymise=anonymise, source=ingested.source, lazy_rows=True)
    except (AccountingError, ValueError) as exc:
        raise click.ClickException(str(exc))
    except sqlite3.Error as exc:
        raise click.ClickException(f"cannot read the store {store_path}: {exc}")
    finally:
        if store is not None:
            store.close()
    report["new_jobs"] = ingested.new
    # The jobs and the report live until the process ends: keep the collector from walking
    # them again, at every full collection and at exit (seconds for a million jobs).
    gc.freeze()
    if missing_store:
        report["notes"].insert(0, missing_store)
    if not output:
        write_report(report, fmt, sys.stdout, terminal=True)
        return
    try:
        with replacing(output) as handle:  # the old file stays until the report is whole
            write_report(report, fmt, handle, terminal=False)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}")
    click.echo(f"wrote {output}", err=True)


commands = [report_command]
