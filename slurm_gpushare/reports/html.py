"""The savings report as one self-contained HTML page (plots inlined as SVG, no scripts, no
network): the verdict and headline figures -- savings and costs -- first, then savings over
time, the slowdown distribution, the class-pair heat map, and the tables behind them.

Every figure comes from ``reports.savings`` (defined in docs/reports.md); this module only
renders. Each plot carries its axes' limits as ``data-`` attributes and names its legend and
labels (SVG ids), so a browser test can check what is drawn where."""

from __future__ import annotations

import html
import io
import re
from datetime import datetime
from typing import Any

from dataclasses import dataclass

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
.verdict{font-size:1.05rem;background:#fff;border-left:4px solid #7570b3;padding:.7rem 1rem;
box-shadow:0 1px 3px #0002}
figure{margin:0}figure svg{width:100%;height:auto}
"""


@dataclass
class Plot:
    svg: str
    axes: dict[str, float]  # data-* attributes: the drawn axes' limits


def _svg(fig, name: str, axes: dict[str, float] | None = None) -> Plot:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: inlined in HTML
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    # Each figure's internal ids (clip paths, glyphs) get the plot's name as a prefix, so
    # several figures on one page never share an id.
    text = re.sub(r'id="([^"]+)"', lambda m: f'id="{name}-{m.group(1)}"', text)
    text = re.sub(r'url\(#([^)]+)\)', lambda m: f"url(#{name}-{m.group(1)})", text)
    text = re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#{name}-{m.group(1)}"', text)
    text = text.replace("<svg ", '<svg width="100%" height="auto" ', 1)
    return Plot(text, axes or {})


def _img(plot: Plot, alt: str) -> str:
    attrs = "".join(f' data-{k}="{v:.6f}"' for k, v in sorted(plot.axes.items()))
    return f'<figure role="img" aria-label="{html.escape(alt)}"{attrs}>{plot.svg}</figure>'


def _fmt(value: Any, kind: str = "") -> str:
    if value is None:
        return "–"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "h":
        return f"{value:.2f}"
    if kind == "s":
        return f"{value:.0f} s"
    if kind == "x":
        return f"{value:.2f}×"
    return html.escape(str(value))


def plot_savings(report: dict) -> Plot | None:
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
    # The cumulative axis includes zero (a saving reads against nothing saved); the x axis
    # spans the report's window, from the start of its first bucket, and no further.
    low, high = min(0.0, *cumulative), max(0.0, *cumulative)
    ax2.set_ylim(low * 1.1, high * 1.1 if high > 0 else 1e-3)
    ax.set_ylim(bottom=0)
    window = report["window"]
    first = min(r["start"] for r in rows)
    ax.set_xlim(matplotlib.dates.date2num(datetime.fromtimestamp(min(first, window["since"]))),
                matplotlib.dates.date2num(datetime.fromtimestamp(window["until"])))
    ax.set_ylabel("GPU-hours per " + ("hour" if step == 3600 else "day"))
    ax2.set_ylabel("GPU-hours saved (cumulative)", color=SAVED)
    ax.set_title("GPU-hours: used with sharing vs. whole GPUs")
    ax.patch.set_gid("plot-area")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8,
              bbox_to_anchor=(0, -0.25), ncol=3, frameon=False).set_gid("legend")
    fig.autofmt_xdate()
    x0, x1 = ax.get_xlim()
    y0, y1 = ax2.get_ylim()
    epoch = matplotlib.dates.date2num(datetime.fromtimestamp(0))
    return _svg(fig, "savings", {"x-from": (x0 - epoch) * 86400, "x-to": (x1 - epoch) * 86400,
                                 "cumulative-from": y0, "cumulative-to": y1,
                                 "cumulative-min": min(cumulative)})


def plot_isd(report: dict) -> Plot | None:
    jobs = [j for j in report["shared_jobs"] if j["isd"] is not None]
    if not jobs:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for source, color, label in (
            ("history", USED, "against its own solo runs"),
            ("predictor", BAD, "against a predicted solo time (not in the totals)")):
        values = [j["isd"] * 100 for j in jobs if j["solo_source"] == source]
        if values:
            ax.hist(values, bins=min(20, max(5, len(values))), color=color, alpha=.8,
                    label=f"{label} ({len(values)})")
    ax.set_xlabel("slowdown of a shared job vs. alone (ISD, %)")
    ax.set_ylabel("jobs")
    ax.set_title("How much sharing slowed jobs down", pad=16)
    median = report["totals"]["isd_median"]  # the report's median, not a second one
    if median is not None:
        median *= 100
        ax.axvline(median, color="#222", ls="--", lw=1)
        # The median's label sits above the plot area, the legend below it: never over each
        # other.
        ax.annotate(f"median {median:.0f}%", xy=(median, 1.0),
                    xycoords=("data", "axes fraction"), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom",
                    fontsize=8).set_gid("median-label")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=1,
              frameon=False).set_gid("legend")
    return _svg(fig, "isd")


def plot_class_pairs(report: dict) -> Plot | None:
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
    return _svg(fig, "pairs")


def _plot_block(data: Plot | None, alt: str, empty: str, wide: bool = False) -> str:
    body = _img(data, alt) if data else f'<div class="empty">{html.escape(empty)}</div>'
    return f'<div class="plot{" wide" if wide else ""}">{body}</div>'


def _card(value: str, label: str, cls: str = "") -> str:
    return (f'<div class="card {cls}"><div class="v">{value}</div>'
            f'<div class="l">{html.escape(label)}</div></div>')


def _rows_table(report: dict) -> str:
    head = ["", "GPU jobs", "on shares", "GPU-h used", "GPU-h whole GPUs", "GPU-h saved", "PS",
            "ISD median", "slowed > 20%", "queue shared (median)", "queue whole (median)",
            "extra queueing (h)", "outgrew share", "OOM shared/whole", "failed shared/whole",
            "requeued runs"]
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for row in report["rows"] + [{"key": "all", **report["totals"]}]:
        cells = [_fmt(row["key"]), row["gpu_jobs"], row["shared_jobs"],
                 _fmt(row["gpu_hours_used"], "h"), _fmt(row["gpu_hours_exclusive"], "h"),
                 _fmt(row["gpu_hours_saved"], "h"), _fmt(row["ps"], "pct"),
                 _fmt(row["isd_median"], "pct"), row["slowed_jobs"],
                 _fmt(row["queue_delay_shared_median_s"], "s"),
                 _fmt(row["queue_delay_exclusive_median_s"], "s"),
                 _fmt(row["extra_queue_hours"], "h"), row["overrun_shared"],
                 f"{row['oom_shared']}/{row['oom_exclusive']}",
                 f"{row['failed_shared']}/{row['failed_exclusive']}",
                 row["requeued_runs_shared"] + row["requeued_runs_exclusive"]]
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
        return ('<p class="note">No shared job has observed GPU memory telemetry in this '
                "window.</p>")
    head = ["decision from", "jobs", "predictor: (estimate − peak) ÷ peak, mean",
            "p95 |error|", "estimate below peak", "policy: share ÷ peak, median",
            "share below peak"]
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for source, q in report["prediction"].items():
        cells = [_fmt(source), q["n"], _fmt(q["estimate_error_mean"], "pct"),
                 _fmt(q["estimate_error_p95"], "pct"),
                 f"{q['estimate_below_peak']} of {q['estimate_n']}",
                 _fmt(q["share_over_peak_median"], "x"),
                 f"{q['share_below_peak']} of {q['share_n']}"]
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "".join(out) + "</table>"


def render_html(report: dict) -> str:
    t = report["totals"]
    window = report["window"]
    span = (f"{datetime.fromtimestamp(window['since']):%Y-%m-%d %H:%M} – "
            f"{datetime.fromtimestamp(window['until']):%Y-%m-%d %H:%M}")
    saved_cls = "good" if (t["gpu_hours_saved"] or 0) > 0 else "warn"
    isd_label = f"median slowdown of shared jobs (n={t['isd_n']}"
    if t["isd_median_low"] is not None:
        isd_label += (f"; {_fmt(t['isd_median_low'], 'pct')} to "
                      f"{_fmt(t['isd_median_high'], 'pct')} from sacct's 1 s times")
    isd_label += ", small sample)" if t["isd_small_sample"] else ")"
    queue = t["extra_queue_hours"]
    cards = "".join([
        _card(_fmt(t["gpu_hours_saved"], "h"), "GPU-hours saved", saved_cls),
        _card(_fmt(t["saved_fraction"], "pct"), "of the GPU-hours whole GPUs would take",
              saved_cls),
        _card(_fmt(t["ps"], "pct"), "packing saving (co-run groups)"),
        _card(_fmt(queue, "h"), "extra queueing on shares vs whole GPUs (h)",
              "warn" if queue is not None and queue > 0 else ""),
        _card(_fmt(t["isd_median"], "pct"), isd_label,
              "warn" if t["isd_small_sample"] or t["slowed_jobs"] else ""),
        _card(f"{t['slowed_jobs']} / {t['isd_n']}", "shared jobs slowed more than 20%",
              "warn" if t["slowed_jobs"] else ""),
        _card(f"{t['overrun_shared']} · {t['oom_shared']}",
              "outgrew their share · killed for memory (shared)",
              "warn" if t["overrun_shared"] or t["oom_shared"] else ""),
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
<p class="verdict">{html.escape(report['verdict'])}</p>
<div class="cards">{cards}</div>
<div class="plots">{plots}</div>
<h2>By {html.escape(report['by'])}</h2>{_rows_table(report)}
<h2>Jobs that shared a GPU</h2>{_groups_table(report)}
<h2>GPU memory: the predictor's error and the policy's over-allocation</h2>{_prediction(report)}
<h2>How these figures are made</h2>
<ul class="note">
<li>Each figure is defined once, in the product's docs (docs/reports.md); in short:</li>
<li>Packing saving = 1 − makespan of a co-run group ÷ the sum of its jobs' solo run times.</li>
<li>Slowdown (ISD) = a shared job's run time ÷ its solo run time − 1; the solo time comes from
the job's own earlier solo runs (history) or the run-time predictor, as shown per job; its range
follows from sacct's 1-second times.</li>
<li>Whole-GPU counterfactual: every job on its own GPU(s) for its solo time; a share stands for
the one GPU it replaced.</li>
<li>Extra queueing = (mean wait of shared jobs − mean wait of whole-GPU jobs) × shared jobs.</li>
<li>Failed and cancelled jobs count in GPU-hours and failures, not in slowdowns.</li>
{notes}
</ul>
<p class="note">Generated {html.escape(report['generated'])} by slurm-gpushare.</p>
</body></html>
"""
