"""The product as a site installs it: a wheel, outside the repository.

Built and installed into a scratch directory (dependencies come from the test environment),
then run from another working directory so nothing of the repository is importable:
check-config, hook-config, simulate and report work, the hook ships inside, and nothing in
the wheel imports the development tooling (devcluster, tests).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"


# What the build reads: the package and its metadata (setup.cfg names README.md).
SOURCES = ("pyproject.toml", "setup.cfg", "README.md", "slurm_gpushare")


def build_wheel(root: Path) -> Path:
    """The wheel, built by the backend's PEP 517 hook (as pip calls it, without pip's start-up)
    from a private copy of the sources: the backend writes build/ and *.egg-info beside them,
    so two test workers building in the checkout at once would delete each other's files."""
    source = root / "src"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    build = ("import sys, setuptools.build_meta as backend; "
             "backend.build_wheel(sys.argv[1])")
    done = subprocess.run([sys.executable, "-c", build, str(root / "dist")], cwd=str(source),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    # Folders of data without __init__.py are packages to setuptools: undeclared, each one
    # printed a 30-line warning into every `make demo` and `make test` install.
    assert "would be ignored" not in done.stdout + done.stderr
    (wheel,) = (root / "dist").glob("slurm_gpushare-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root)
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    work = root / "elsewhere"
    work.mkdir()
    return wheel, site, work


def test_two_builds_at_once_do_not_collide(installed, tmp_path):
    # pytest-xdist runs this module's fixture once per worker, so builds overlap in CI.
    with ThreadPoolExecutor(2) as pool:
        wheels = list(pool.map(build_wheel, [tmp_path / "a", tmp_path / "b"]))
    expected = sorted(zipfile.ZipFile(installed[0]).namelist())
    assert [sorted(zipfile.ZipFile(w).namelist()) for w in wheels] == [expected, expected]


def run(installed, *args, env=None):
    _, site, work = installed
    environ = {**os.environ, "PYTHONPATH": str(site), **(env or {})}
    environ.pop("SLURM_CONF", None)
    return subprocess.run([sys.executable, "-m", "slurm_gpushare", *args], cwd=str(work),
                          env=environ, capture_output=True, text=True, timeout=300)


def test_the_wheel_holds_the_product_and_no_test_tooling(installed):
    wheel, site, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "slurm_gpushare/lua/job_submit.lua" in names
    assert "slurm_gpushare/lua/gpushare_tres.lua" in names
    assert not [n for n in names if n.startswith(("devcluster/", "tests/"))]
    for path in (site / "slurm_gpushare").rglob("*.py"):
        text = path.read_text()
        assert "devcluster" not in text.replace("development cluster", ""), path


def test_commands_run_from_the_installed_wheel(installed, tmp_path):
    _, site, _ = installed
    where = run(installed, "--version")
    assert where.returncode == 0, where.stderr
    probe = subprocess.run([sys.executable, "-c", "import slurm_gpushare; print(slurm_gpushare.__file__)"],
                           cwd=str(installed[2]), env={**os.environ, "PYTHONPATH": str(site)},
                           capture_output=True, text=True)
    assert probe.stdout.startswith(str(site)), probe.stdout  # not the repository's copy

    config = tmp_path / "gpushare.toml"
    config.write_text('[daemon]\nsocket = "/tmp/none.sock"\n[policy]\nsharing_partitions = ["gpu"]\n'
                      '[gpu_types.a100]\nmemory_gib = 80\n')
    hook = run(installed, "hook-config", "--config", str(config))
    assert hook.returncode == 0 and '"/tmp/none.sock"' in hook.stdout, hook.stderr

    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nSelectType=select/cons_tres\nGresTypes=gpu,shard\n"
                    "JobSubmitPlugins=lua\n")
    check = run(installed, "check-config", "--no-live", "--slurm-conf", str(conf),
                "--config", str(config), "--json")
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
    findings = json.loads(check.stdout)["findings"]
    hook_fixes = [f.get("fix") or "" for f in findings if f["check"] == "hook-files"]
    # The fix installs the hook from the wheel's own copy.
    assert hook_fixes and all(str(site / "slurm_gpushare" / "lua") in fix for fix in hook_fixes)

    header = "JobID|JobIDRaw|User|Account|Partition|State|ExitCode|Submit|Start|End|Elapsed|NodeList|AllocTRES|AdminComment"
    sacct = tmp_path / "sacct.psv"
    sacct.write_text(header + "\n7|7|alice|a|gpu|COMPLETED|0:0|1700000100|1700000110|1700000170|60|n1|"
                     "billing=1,cpu=1,gres/gpu=1,gres/gpu:a100=1|\n")
    report = run(installed, "report", "--sacct-file", str(sacct), "--since", "1700000000", "--until", "1700001000",
                 "--format", "json")
    assert report.returncode == 0, report.stderr


@pytest.mark.skipif(not DATA.is_dir(), reason="the public data sets (../shared/data) are not here")
def test_simulate_runs_from_the_installed_wheel(installed, tmp_path):
    sim = run(installed, "simulate", "--trace", "philly", "--cluster", "philly", "--limit", "300",
              "--policy", "slurm-default,gpushare", "--data-dir", str(DATA), "--no-plots", "--json")
    assert sim.returncode == 0, sim.stderr
    assert "gpushare" in sim.stdout
