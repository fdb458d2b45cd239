"""The savings report as one self-contained HTML page (plots inlined as PNG, no scripts, no
network): headline figures first, then savings over time, the slowdown distribution, the
class-pair heat map, and the tables behind them."""

from __future__ import annotations

import base64
import html
import io
from datetime import datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on a login or admin node
import matplotlib.dates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

SAVED, USED, EXCL, BAD = "#1b9e77", "#7570b3", "#bbbbbb", "#d95f02"

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;
max-width:1180px;color:#222;background:#fafafa}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem}
.sub{color:#666;margin-top:0}
.cards{display:flex;gap:1rem;flex-wrap:wrap;margin:1.2rem 0}
.card{background:#fff;border-radius:10px;padding:1rem 1.3rem;box-shadow:0 1px 3px #0002;
min-width:120px;flex:1}
.card .v{font-size:2rem;font-weight:600}.card .l{color:#555;font-size:.9rem}
.good .v{color:#1b9e77}.warn .v{color:#d95f02}
.plots{display:grid;grid-template-columns:1fr 1fr;gap:1rem}
.plot{background:#fff;border-radius:10px;padding:.6rem;box-shadow:0 1px 3px #0002}
.plot.wide{grid-column:1/3}.plot img{width:100%}
.empty{color:#888;padding:3rem 1rem;text-align:center}
table{border-collapse:collapse;background:#fff;width:100%;font-size:.9rem;
box-shadow:0 1px 3px #0002}
th,td{padding:.35rem .6rem;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f0f0f0}
.note{color:#666;font-size:.85rem}
"""


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _img(data: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _fmt(value: Any, kind: str = "") -> str:
    if value is None:
        return "–"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "h":
        return f"{value:.2f}"
    if kind == "s":
        return f"{value:.0f} s"
    return html.escape(str(value))


def plot_savings(report: dict) -> str | None:
    rows = report["timeline"]
    if not rows:
        return None
    step = rows[0]["step_s"]
    when = [datetime.fromtimestamp(r["start"]) for r in rows]
    width = step / 86400 * 0.8
    fig, ax = plt.subplots(figsize=(10, 3.4))
    ax.bar(when, [r["gpu_hours_exclusive"] for r in rows], width=width, color=EXCL,
           align="edge", label="on whole GPUs (counterfactual)")
    ax.bar(when, [r["gpu_hours_used"] for r in rows], width=width * 0.6, color=USED,
           align="edge", label="used with sharing")
    ax2 = ax.twinx()
    cumulative, total = [], 0.0
    for r in rows:
        total += r["gpu_hours_saved"]
        cumulative.append(total)
    ax2.plot(when, cumulative, color=SAVED, marker="o", lw=2, label="saved, cumulative")
    pad = step / 86400
    ax.set_xlim(matplotlib.dates.date2num(when[0]) - pad,
                matplotlib.dates.date2num(when[-1]) + 2 * pad)
    ax.set_ylabel("GPU-hours per " + ("hour" if step == 3600 else "day"))
    ax2.set_ylabel("GPU-hours saved (cumulative)", color=SAVED)
    ax.set_title("GPU-hours: used with sharing vs. whole GPUs")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    return _png(fig)


def plot_isd(report: dict) -> str | None:
    jobs = [j for j in report["shared_jobs"] if j["isd"] is not None]
    if not jobs:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for source, color in (("history", USED), ("predictor", BAD)):
        values = [j["isd"] * 100 for j in jobs if j["solo_source"] == source]
        if values:
            ax.hist(values, bins=min(20, max(5, len(values))), color=color, alpha=.8,
                    label=f"solo time from {source} ({len(values)})")
    median = sorted(j["isd"] for j in jobs)[len(jobs) // 2] * 100
    ax.axvline(median, color="#222", ls="--", lw=1)
    ax.text(median, ax.get_ylim()[1] * .92, f" median {median:.0f}%", fontsize=8)
    ax.set_xlabel("slowdown of a shared job vs. alone (ISD, %)")
    ax.set_ylabel("jobs")
    ax.set_title("How much sharing slowed jobs down")
    ax.legend(fontsize=8)
    return _png(fig)


def plot_class_pairs(report: dict) -> str | None:
    cells = report["class_matrix"]
    if not cells:
        return None
    classes = sorted({c["class"] for c in cells} | {c["with"] for c in cells},
                     key=lambda c: (c == "?", c))
    index = {c: i for i, c in enumerate(classes)}
    grid = [[float("nan")] * len(classes) for _ in classes]
    for c in cells:
        grid[index[c["class"]]][index[c["with"]]] = c["isd_mean"] * 100
    fig, ax = plt.subplots(figsize=(5.2, 3.4 + 0.1 * len(classes)))
    image = ax.imshow(grid, cmap="RdYlGn_r", vmin=0, vmax=max(50.0, max(
        c["isd_mean"] * 100 for c in cells)))
    for c in cells:
        ax.text(index[c["with"]], index[c["class"]],
                f"{c['isd_mean'] * 100:.0f}%\nn={c['n']}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(classes)), [f"with {c}" for c in classes])
    ax.set_yticks(range(len(classes)), [f"class {c}" for c in classes])
    ax.set_title("Mean slowdown by interference class pair")
    fig.colorbar(image, ax=ax, label="ISD %")
    return _png(fig)


def _plot_block(data: str | None, alt: str, empty: str, wide: bool = False) -> str:
    body = _img(data, alt) if data else f'<div class="empty">{html.escape(empty)}</div>'
    return f'<div class="plot{" wide" if wide else ""}">{body}</div>'


def _card(value: str, label: str, cls: str = "") -> str:
    return (f'<div class="card {cls}"><div class="v">{value}</div>'
            f'<div class="l">{html.escape(label)}</div></div>')


def _rows_table(report: dict) -> str:
    head = ["", "GPU jobs", "on shares", "GPU-h used", "GPU-h whole GPUs", "GPU-h saved", "PS",
            "ISD median", "ISD p95", "queue shared (median)", "queue whole (median)",
            "OOM shared/whole", "failed shared/whole"]
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for row in report["rows"] + [{"key": "all", **report["totals"]}]:
        cells = [_fmt(row["key"]), row["gpu_jobs"], row["shared_jobs"],
                 _fmt(row["gpu_hours_used"], "h"), _fmt(row["gpu_hours_exclusive"], "h"),
                 _fmt(row["gpu_hours_saved"], "h"), _fmt(row["ps"], "pct"),
                 _fmt(row["isd_median"], "pct"), _fmt(row["isd_p95"], "pct"),
                 _fmt(row["queue_delay_shared_median_s"], "s"),
                 _fmt(row["queue_delay_exclusive_median_s"], "s"),
                 f"{row['oom_shared']}/{row['oom_exclusive']}",
                 f"{row['failed_shared']}/{row['failed_exclusive']}"]
        tag = "th" if row["key"] == "all" else "td"
        out.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
    return "".join(out) + "</table>"


def _groups_table(report: dict, limit: int = 40) -> str:
    groups = [g for g in report["groups"] if len(g["jobs"]) > 1]
    if not groups:
        return '<p class="note">No co-run groups in this window.</p>'
    head = ["GPU", "type", "jobs", "classes", "makespan", "sum of solo times", "PS",
            "ISD per job (solo time from)"]
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for g in groups[:limit]:
        isd = "; ".join(f"{html.escape(m['job_id'])}: {_fmt(m['isd'], 'pct')} "
                        f"({html.escape(m['solo_source'])})" for m in g["members"])
        cells = [_fmt(g["gpu"]), _fmt(g["gpu_type"]), _fmt(" ".join(g["jobs"])),
                 _fmt(g["class_pair"]), _fmt(g["makespan_s"], "s"), _fmt(g["solo_sum_s"], "s"),
                 _fmt(g["ps"], "pct"), isd]
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    more = (f'<p class="note">{len(groups) - limit} more groups in the JSON output.</p>'
            if len(groups) > limit else "")
    return "".join(out) + "</table>" + more


def _prediction(report: dict) -> str:
    if not report["prediction"]:
        return ('<p class="note">No shared job has both a memory share and observed telemetry '
                "in this window.</p>")
    head = ["decision from", "jobs", "peak above share", "mean |share − peak| / peak",
            "p95", "median peak / share"]
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for source, q in report["prediction"].items():
        cells = [_fmt(source), q["n"], q["over_share"], _fmt(q["rel_error_mean"], "pct"),
                 _fmt(q["rel_error_p95"], "pct"), _fmt(q["peak_over_share_median"], "pct")]
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "".join(out) + "</table>"


def render_html(report: dict) -> str:
    t = report["totals"]
    window = report["window"]
    span = (f"{datetime.fromtimestamp(window['since']):%Y-%m-%d %H:%M} – "
            f"{datetime.fromtimestamp(window['until']):%Y-%m-%d %H:%M}")
    cards = "".join([
        _card(_fmt(t["gpu_hours_saved"], "h"), "GPU-hours saved", "good"),
        _card(_fmt(t["saved_fraction"], "pct"), "of the GPU-hours whole GPUs would take",
              "good"),
        _card(_fmt(t["ps"], "pct"), "packing saving (co-run groups)"),
        _card(_fmt(t["isd_median"], "pct"), f"median slowdown of shared jobs (n={t['isd_n']})"),
        _card(f"{t['oom_shared']} / {t['oom_exclusive']}", "OOM kills: shared / whole GPU",
              "warn" if t["oom_shared"] else ""),
        _card(f"{t['shared_jobs']} / {t['gpu_jobs']}", "GPU jobs that ran on shares"),
    ])
    plots = "".join([
        _plot_block(plot_savings(report), "GPU-hours over time",
                    "No finished GPU jobs in this window.", wide=True),
        _plot_block(plot_isd(report), "Slowdown distribution",
                    "No shared job with a known solo time."),
        _plot_block(plot_class_pairs(report), "Class-pair heat map",
                    "No co-run with known interference classes."),
    ])
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.get("notes", []))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>GPU sharing report {html.escape(span)}</title><style>{_CSS}</style></head>
<body>
<h1>What GPU sharing saved</h1>
<p class="sub">{html.escape(span)} · {t['gpu_jobs']} GPU jobs finished
({t['running_jobs']} still running, not counted) · source: {html.escape(report['source'])}
{' · user names anonymised' if report.get('anonymised') else ''}</p>
<div class="cards">{cards}</div>
<div class="plots">{plots}</div>
<h2>By {html.escape(report['by'])}</h2>{_rows_table(report)}
<h2>Jobs that shared a GPU</h2>{_groups_table(report)}
<h2>Memory shares vs. observed peaks</h2>{_prediction(report)}
<h2>How these figures are made</h2>
<ul class="note">
<li>Packing saving = 1 − makespan of a co-run group ÷ the sum of its jobs' solo run times.</li>
<li>Slowdown (ISD) = a shared job's run time ÷ its solo run time − 1; the solo time comes from
the job's own earlier solo runs (history) or the run-time predictor, as shown per job.</li>
<li>Whole-GPU counterfactual: every job on its own GPU(s) for its solo time; a share stands for
the one GPU it replaced.</li>
<li>Failed and cancelled jobs count in GPU-hours and failures, not in slowdowns.</li>
{notes}
</ul>
<p class="note">Generated {html.escape(report['generated'])} by slurm-gpushare.</p>
</body></html>
"""
