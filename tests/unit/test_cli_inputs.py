"""Bad input to ``simulate``, ``gen-config`` and ``import-usage``: a one-line error naming what
is wrong and a non-zero exit, nothing written -- never a hang, a traceback or broken output."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import pytest

import slurm_gpushare.cli.sim as sim_cli
from slurm_gpushare.cli import main
from slurm_gpushare.sim.run import default_data_dir

AWKWARD = Path(__file__).resolve().parents[1] / "data" / "sacct" / "awkward.psv"
LOCAL = Path(sim_cli.__file__).resolve().parents[1] / "data" / "clusters" / "local.toml"
needs_data = pytest.mark.skipif(not (default_data_dir() / "gavel").exists(),
                                reason="public data sets not found")


class Hang(BaseException):
    """Not an Exception: the CLI's catch-all must not turn it into an error line."""


@contextlib.contextmanager
def deadline(seconds: float = 60):
    def expire(*_):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def fails(argv: list[str], capsys, *words: str) -> None:
    """``argv`` exits non-zero with one line on stderr holding each of ``words``."""
    with deadline():
        code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code != 0, captured.out[-2000:]
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert all(word in err for word in words), err


# ---- simulate ------------------------------------------------------------------------------

def simulate(*args: str) -> list[str]:
    return ["simulate", "--trace", f"sacct:{AWKWARD}", "--cluster", "local", "--no-plots",
            *args]


@pytest.mark.parametrize("option", ["--load", "--gpu-time-budget"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "Infinity"])
def test_simulate_refuses_non_finite_floats(option, value, capsys):
    fails(simulate(option, value, "--json"), capsys, option)


def test_simulate_gpu_time_budget_is_a_percentage(capsys):
    fails(simulate("--gpu-time-budget", "101"), capsys, "--gpu-time-budget", "100")


def test_simulate_load_is_bounded_below(capsys):
    # 5e-324 passes as finite, yet every arrival (submit / load) overflowed to infinity.
    fails(simulate("--load", "5e-324"), capsys, "--load", "0.001")


@needs_data
def test_simulate_still_takes_finite_extremes(capsys):
    import json

    assert main(simulate("--load", "1e300", "--gpu-time-budget", "100", "--json",
                         "--policy", "gpushare")) == 0
    json.loads(capsys.readouterr().out, parse_constant=pytest.fail)  # strict JSON


@pytest.mark.parametrize("policy", [",", " , ", ""])
def test_simulate_without_a_policy(policy, capsys):
    fails(simulate("--policy", policy), capsys, "no policy given")


def test_simulate_seed_is_named(capsys):
    fails(simulate("--seed", "-1"), capsys, "--seed")


def test_simulate_reads_the_trace_before_asking_slurm(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sim_cli, "site_cluster",
                        lambda: pytest.fail("asked scontrol before reading the trace"))
    missing = tmp_path / "missing.psv"
    fails(["simulate", "--trace", f"sacct:{missing}"], capsys, "not found", str(missing))


def test_a_sacct_trace_is_read_as_report_reads_it(tmp_path, capsys):
    from slurm_gpushare.sim.site import load_site

    saved = tmp_path / "saved.psv"  # an editor's byte-order mark, as report accepts it
    saved.write_bytes(b"\xef\xbb\xbf" + AWKWARD.read_bytes())
    assert load_site(saved).equals(load_site(AWKWARD))
    latin = tmp_path / "latin.psv"
    latin.write_bytes(AWKWARD.read_bytes().replace(b"|", b"|\xff", 1))
    fails(["simulate", "--trace", f"sacct:{latin}", "--cluster", "local", "--no-plots"], capsys,
          "not UTF-8", str(latin))


def cluster_file(tmp_path: Path, old: str, new: str) -> Path:
    text = LOCAL.read_text()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("old, new, words", [
    ("weight = 2", 'weight = "heavy"', ["[[nodes]] #2", "weight"]),
    ("weight = 2", "weight = -1", ["[[nodes]] #2", "weight"]),
    ("gpus = 2", "gpus = true", ["[[nodes]] #1", "gpus"]),
    ("count = 2", "count = 2.5", ["[[nodes]] #1", "count"]),
    ("count = 2", "count = 99999999999", ["[[nodes]] #1", "count"]),
    ('prefix = "v100-"', "prefix = 5", ["[[nodes]] #1", "prefix"]),
    ('type = "v100"', 'type = ["v100"]', ["[[nodes]] #1", "type"]),
    ("memory_gib = 16", "memory_gib = true", ["[gpu_types.v100]", "memory_gib"]),
    ('model = "V100-16GB"', "model = 16", ["[gpu_types.v100]", "model"]),
    ('speed_profile = "v100"', "speed_profile = 1", ["[gpu_types.v100]", "speed_profile"]),
    ("[gpu_types.v100]", "[gpu_types]\nv100 = 5\n[gpu_types.x]", ["[gpu_types.v100]"]),
    ('reference_gpu = "v100"', 'reference_gpu = ["v100"]', ["reference_gpu"]),
    ('partition = "gpu"', "partition = 1", ["partition"]),
    ("max_jobs_per_gpu = 4", "max_jobs_per_gpu = true", ["max_jobs_per_gpu"]),
])
def test_simulate_names_the_file_and_key_of_a_malformed_cluster_spec(tmp_path, capsys, old,
                                                                     new, words):
    path = cluster_file(tmp_path, old, new)
    fails(["simulate", "--trace", f"sacct:{AWKWARD}", "--cluster", str(path)], capsys,
          str(path), *words)


@pytest.mark.parametrize("text, words", [
    ('gpu_types = 5\n[[nodes]]\ntype = "x"\n', ["gpu_types", "[gpu_types.NAME]"]),
    ('[gpu_types.v100]\nmemory_gib = 16\n[nodes]\ntype = "v100"\n', ["[[nodes]]"]),
    ('nodes = 3\n[gpu_types.v100]\nmemory_gib = 16\n', ["[[nodes]]"]),
])
def test_simulate_names_a_cluster_spec_of_the_wrong_shape(tmp_path, capsys, text, words):
    path = tmp_path / "shape.toml"
    path.write_text(text)
    fails(["simulate", "--trace", f"sacct:{AWKWARD}", "--cluster", str(path)], capsys,
          str(path), *words)


# ---- gen-config ----------------------------------------------------------------------------

@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "gpushare.toml"
    path.write_text("[gpu_types.a100]\nmemory_gib = 80\n[gpu_types.v100]\nmemory_gib = 16\n")
    return path


@pytest.mark.parametrize("nodes, words", [
    (["gpu[01-99999999]:a100:4"], ["gpu[01-99999999]", "more than 65536"]),
    (["gpu[01-:a100:4"], ["gpu[01-", "malformed"]),
    (["gpu[04-01]:a100:4"], ["gpu[04-01]", "reversed range 04-01"]),
    (["gpu01:a100:4", "gpu01:v100:2"], ["gpu01", "twice"]),
    (["gpu[01-04]:a100:4", "gpu04:a100:4"], ["gpu04", "twice"]),
    (["gpu01:a100:99999999999"], ["99999999999", "32"]),
    (["gpu01:a100:33"], ["33", "32"]),
])
def test_gen_config_refuses_what_would_write_a_broken_config(tmp_path, config, capsys, nodes,
                                                              words):
    out = tmp_path / "out"
    argv = ["gen-config", "--config", str(config), "-o", str(out)]
    fails(argv + [x for node in nodes for x in ("--node", node)], capsys, *words)
    assert not out.exists()  # nothing half-written


def test_gen_config_takes_a_full_node(config, capsys):
    assert main(["gen-config", "--config", str(config), "--node", "gpu[01-02]:a100:32"]) == 0
    assert "NodeName=gpu[01-02] Name=gpu Type=a100 File=/dev/nvidia[0-31]" in \
        capsys.readouterr().out


# ---- import-usage --------------------------------------------------------------------------

@pytest.mark.parametrize("args, word", [
    (["--min-age", "nan"], "--min-age"),
    (["--min-age", "inf"], "--min-age"),
    (["--min-age", "-5"], "--min-age"),
    (["--since", "2099-01-01"], "--since"),
])
def test_import_usage_refuses_bad_windows(config, capsys, args, word):
    fails(["import-usage", "--config", str(config), "--sacct-file", str(AWKWARD), "--dry-run",
           *args], capsys, word)
