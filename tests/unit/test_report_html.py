"""The HTML report: self-contained, its plots present, and rendered by a real headless browser
(Debian's chromium) into a screenshot that is not blank."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

import pytest

from slurm_gpushare.slurm.accounting import JobRecord
from slurm_gpushare.reports.savings import build_report, groups_from_placements
from slurm_gpushare.reports.html import render_html
from slurm_gpushare.daemon.fingerprint import Fingerprinter
from slurm_gpushare.daemon.store import Store

T0 = 1_800_000_000.0


def _workload():
    """Three days of pairs sharing GPUs, with solo times from a predictor, classes 0-2."""
    jobs, places = [], {}
    classes = {}
    for day in range(3):
        for k in range(4):
            base = day * 86400 + k * 3600
            pair = ((0, 100, 120 + 10 * k, k % 3), (20, 60, 75, (k + 1) % 3))
            for offset, solo, run, cls in pair:
                job_id = str(1000 + len(jobs))
                tag = f"gpushare:v1:share:id={job_id}ab:shard=8:types=a100:why=history-share"
                jobs.append(JobRecord(job_id=job_id, user=f"u{k}", account=f"acct{k % 2}",
                                      partition="gpu", state="COMPLETED", submit=T0 + base,
                                      start=T0 + base + offset, end=T0 + base + offset + run,
                                      nodes="a100-1", alloc_tres={"gres/shard": 8.0}, tag=tag,
                                      gpu_type="a100"))
                places[job_id] = {("a100-1", k % 2)}
                classes[job_id] = (solo, cls)
        jobs.append(JobRecord(job_id=str(2000 + day), user="u9", account="acct0", partition="gpu",
                              state="FAILED", signal=9, submit=T0 + day * 86400,
                              start=T0 + day * 86400, end=T0 + day * 86400 + 500, nodes="a100-2",
                              alloc_tres={"gres/gpu": 1.0}, gpu_type="a100"))
    # Each shared job's solo time from its own history (one solo run each) in a store.
    fp = Fingerprinter(b"h" * 32)
    store = Store(":memory:")
    for j in jobs:
        if j.job_id in classes:
            keys = fp.job_keys(user=j.user, script=f"#!/bin/sh\n: {j.job_id}\n",
                               name=j.job_id).as_list()
            store.record_decision({"decision_id": j.decision_id, "action": "share",
                                   "code": "history-share", "share_gib": 8, "keys": keys,
                                   "job_id": j.job_id})
            store.ingest_summary({"v": 1, "job_id": f"9{j.job_id}", "gpu_index": 0,
                                  "duration_s": classes[j.job_id][0], "shared": False,
                                  "coruns": [], "keys": keys})
    report = build_report(jobs, since=T0, until=T0 + 3 * 86400,
                          groups=groups_from_placements(jobs, places), store=store)
    store.close()
    # Interference classes come from decisions in the store; set them directly here.
    for cell_job in report["shared_jobs"]:
        cell_job["class_pair"] = "x"
    report["class_matrix"] = [{"class": str(a), "with": str(b), "n": 2, "isd_mean": 0.1 * (a + b)}
                              for a in range(3) for b in range(3)]
    return report


@pytest.fixture(scope="module")
def rendered():
    """The workload's report and its page, rendered once for the tests that only read them
    (three matplotlib plots cost about a second)."""
    report = _workload()
    return report, render_html(report)


def test_page_is_self_contained_with_three_plots(rendered):
    _, page = rendered
    figures = re.findall(r"<figure [^>]*>\s*<svg ", page)
    assert len(figures) == 3
    # Nothing fetched: the only URLs are the SVG namespaces' names.
    assert "<script" not in page and not re.search(r'(src|href)="https?:', page)
    assert "<metadata>" not in page
    assert "GPU-hours saved" in page and "acct0" in page


def test_empty_report_says_so_instead_of_empty_plots():
    report = build_report([], since=T0, until=T0 + 3600)
    page = render_html(report)
    assert "<svg" not in page
    assert "No finished GPU jobs in this window." in page


def test_text_is_escaped():
    report = build_report([JobRecord(job_id="1", account="<b>x</b>", state="COMPLETED",
                                     start=T0, end=T0 + 5, alloc_tres={"gres/gpu": 1.0})],
                          since=T0, until=T0 + 60)
    page = render_html(report)
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:  # make deps installs Debian's chromium: its absence is a broken setup
        pytest.fail("chromium not installed: run make deps (apt-get install -y chromium)")
    return path


def _chromium_args(tmp_path) -> list[str]:
    return [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-default-apps", "--disable-extensions",
            "--metrics-recording-only", "--no-default-browser-check",
            f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}", "--window-size=1280,1600"]


# Appended to a copy of the page (the report itself has no scripts): measures where Chromium
# laid out the plots' legends and labels and writes it into the DOM that --dump-dom prints.
MEASURE = """<script>
window.addEventListener("load", () => {
  const box = id => { const e = document.getElementById(id);
    if (!e) return null; const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  const out = {figures: [...document.querySelectorAll("figure")].map(f => ({...f.dataset,
      width: f.getBoundingClientRect().width})),
    isd_label: box("isd-median-label"), isd_legend: box("isd-legend"),
    savings_legend: box("savings-legend"), savings_axes: box("savings-plot-area")};
  const pre = document.createElement("pre"); pre.id = "measured";
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def _overlap(a, b) -> bool:
    return not (a["right"] <= b["left"] or b["right"] <= a["left"]
                or a["bottom"] <= b["top"] or b["bottom"] <= a["top"])


def test_headless_chromium_lays_out_the_plots_and_their_axes(tmp_path, rendered):
    report, page = rendered
    measured_page = tmp_path / "measured.html"
    measured_page.write_text(page.replace("</body>", MEASURE + "</body>"))
    dom = subprocess.run([*_chromium_args(tmp_path), "--virtual-time-budget=10000",
                          "--dump-dom", measured_page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=False).stdout
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, "Chromium did not run the page: " + dom[-500:]
    import html as html_lib
    import json

    seen = json.loads(html_lib.unescape(found.group(1)))
    assert len(seen["figures"]) == 3 and all(f["width"] > 300 for f in seen["figures"])
    # The median's label and the legend are drawn, and not over each other.
    assert seen["isd_label"] and seen["isd_legend"]
    assert seen["isd_label"]["right"] > seen["isd_label"]["left"]
    assert not _overlap(seen["isd_label"], seen["isd_legend"]), seen
    # GPU-hours over time: the x axis spans the window (from its first bucket), no further;
    # the cumulative axis starts at zero (every cumulative value here is a saving).
    savings = next(f for f in seen["figures"] if "xTo" in f)
    window = report["window"]
    first = min(r["start"] for r in report["timeline"])
    assert float(savings["xTo"]) == pytest.approx(window["until"], abs=1)
    assert float(savings["xFrom"]) == pytest.approx(min(first, window["since"]), abs=1)
    assert float(savings["cumulativeMin"]) > 0
    assert float(savings["cumulativeFrom"]) == 0.0
    assert float(savings["cumulativeTo"]) > float(savings["cumulativeMin"])
    # The legend of that plot lies outside its axes (below), not over the bars.
    assert seen["savings_legend"]["top"] >= seen["savings_axes"]["bottom"] - 1, seen


def test_headless_chromium_renders_the_plots(tmp_path, rendered):
    page = tmp_path / "report.html"
    page.write_text(rendered[1])
    shot = tmp_path / "report.png"
    subprocess.run([*_chromium_args(tmp_path), f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.stat().st_size > 10_000, "no screenshot"
    from matplotlib import image

    pixels = image.imread(str(shot))[..., :3]
    # Not blank: many distinct colours, and the plot colours of the report are on the page.
    colours = {tuple((p * 255).astype(int)) for p in pixels[::7, ::7].reshape(-1, 3)}
    assert len(colours) > 50
    # The bars' purple (html.USED) is drawn only inside the plots.
    r, g, b = (pixels[..., i] for i in range(3))
    purple = (abs(r - 117 / 255) < .06) & (abs(g - 112 / 255) < .06) & (abs(b - 179 / 255) < .06)
    assert purple.sum() > 2000, "the plots' colours are missing: were they drawn?"
