"""The HTML report: self-contained, its plots present, and rendered by a real headless browser
(Debian's chromium) into a screenshot that is not blank."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import tempfile

import pytest

from slurm_gpushare.slurm.accounting import JobRecord
from slurm_gpushare.reports.savings import build_report, groups_from_placements
from slurm_gpushare.reports.html import render_html

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
    report = build_report(jobs, since=T0, until=T0 + 3 * 86400,
                          groups=groups_from_placements(jobs, places),
                          predictor=lambda j: classes.get(j.job_id, (None,))[0])
    # Interference classes come from decisions in the store; set them directly here.
    for cell_job in report["shared_jobs"]:
        cell_job["class_pair"] = "x"
    report["class_matrix"] = [{"class": str(a), "with": str(b), "n": 2, "isd_mean": 0.1 * (a + b)}
                              for a in range(3) for b in range(3)]
    return report


def test_page_is_self_contained_with_three_plots():
    page = render_html(_workload())
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 3
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "GPU-hours saved" in page and "acct0" in page


def test_empty_report_says_so_instead_of_empty_plots():
    report = build_report([], since=T0, until=T0 + 3600)
    page = render_html(report)
    assert "data:image/png" not in page
    assert "No finished GPU jobs in this window." in page


def test_text_is_escaped():
    report = build_report([JobRecord(job_id="1", account="<b>x</b>", state="COMPLETED",
                                     start=T0, end=T0 + 5, alloc_tres={"gres/gpu": 1.0})],
                          since=T0, until=T0 + 60)
    page = render_html(report)
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None,
                    reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_headless_chromium_renders_the_plots(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(_workload()))
    shot = tmp_path / "report.png"
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}",
               f"--screenshot={shot}", "--window-size=1280,1600", page.as_uri()]
    subprocess.run(command, capture_output=True, timeout=60, check=False)
    assert shot.exists() and shot.stat().st_size > 10_000, "no screenshot"
    from matplotlib import image

    pixels = image.imread(str(shot))[..., :3]
    # Not blank: many distinct colours, and the plot colours of the report are on the page.
    colours = {tuple((p * 255).astype(int)) for p in pixels[::7, ::7].reshape(-1, 3)}
    assert len(colours) > 50
    # The bars' purple (report_html.USED) is drawn only inside the plot images.
    r, g, b = (pixels[..., i] for i in range(3))
    purple = (abs(r - 117 / 255) < .06) & (abs(g - 112 / 255) < .06) & (abs(b - 179 / 255) < .06)
    assert purple.sum() > 2000, "the plots' colours are missing: were the images drawn?"
