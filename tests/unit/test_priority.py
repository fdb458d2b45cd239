"""The SJF lever: decide() sets nice from the job's predicted run time (own history only)."""

from __future__ import annotations

import pytest

from slurm_gpushare.core.config import ConfigError, parse_config
from slurm_gpushare.core.policy import JobEstimate, decide, sjf_nice
from slurm_gpushare.core.types import Decision, JobRequest


def config(**policy):
    return parse_config({
        "policy": {"sharing_partitions": ["gpu"], "priority": "sjf", **policy},
        "gpu_types": {"v100": {"memory_gib": 16}, "a100": {"memory_gib": 80}},
    })


def request(**fields) -> JobRequest:
    return JobRequest(**{"uid": 1000, "partition": "gpu", "tres_per_node": "gres:gpu:1", **fields})


def history(runtime_s: float, memory_mib: float = 6000) -> JobEstimate:
    return JobEstimate(source="history", memory_mib={"v100": memory_mib, "a100": memory_mib},
                       runtime_s={"v100": runtime_s * 2, "a100": runtime_s}, job_class=0)


def test_nice_is_log_scaled_around_the_reference_and_bounded():
    cfg = config(sjf_reference_s=3600, sjf_nice_per_decade=500, sjf_nice_max=1000)
    assert sjf_nice(request(), cfg, history(3600)) == 0
    assert sjf_nice(request(), cfg, history(36000)) == 500
    assert sjf_nice(request(), cfg, history(360)) == -500
    assert sjf_nice(request(), cfg, history(3600 * 10 ** 4)) == 1000  # bounded
    assert sjf_nice(request(), cfg, history(0.036)) == -1000


def test_shorter_predicted_jobs_get_a_smaller_nice():
    cfg = config()
    nices = [sjf_nice(request(), cfg, history(s)) for s in (60, 600, 3000, 7200, 86400)]
    assert nices == sorted(nices) and len(set(nices)) == len(nices)


def test_share_carries_nice_from_the_fastest_type():
    decision = decide(request(), config(), estimate=history(36000))
    assert decision.action == "share"
    assert decision.writes["nice"] == "10000"  # a100: 10 h
    assert decision.details["nice"] == 10000
    assert "nice +10000 (predicted run time 10.0 h" in decision.reason


@pytest.mark.parametrize("seconds, said", [(20, "20 s"), (59.6, "60 s"), (90, "2 min"),
                                            (5400, "1.5 h")])
def test_reason_says_short_run_times_in_seconds(seconds, said):
    decision = decide(request(), config(), estimate=history(seconds))
    assert f"(predicted run time {said}, shortest job first)" in decision.reason


def test_kept_job_is_reordered_too():
    decision = decide(request(), config(), estimate=history(360, memory_mib=200_000),
                      decision_id="k")
    assert decision.action == "keep" and decision.code == "does-not-fit"
    assert decision.writes == {"admin_comment": "gpushare:v1:keep:id=k:why=does-not-fit",
                               "nice": "-10000"}


def test_multi_gpu_job_kept_untouched_but_reordered():
    decision = decide(request(tres_per_node="gres:gpu:4"), config(), estimate=history(36000))
    assert decision.code == "multi-gpu" and decision.writes == {"nice": "10000"}


@pytest.mark.parametrize("estimate", [
    None,
    JobEstimate(source="hint", memory_mib={"v100": 4000}, runtime_s={"v100": 60}),
    JobEstimate(source="history", memory_mib={"v100": 4000}),
])
def test_no_history_no_run_time_leaves_the_priority_alone(estimate):
    decision = decide(request(mem_hint_mib=4000), config(), estimate=estimate)
    assert "nice" not in decision.writes


def test_lever_off_by_default_and_per_partition():
    off = parse_config({"policy": {"sharing_partitions": ["gpu"]},
                        "gpu_types": {"v100": {"memory_gib": 16}}})
    assert "nice" not in decide(request(), off, estimate=history(36000)).writes
    # Only in the partitions it is enabled for (default: the sharing partitions).
    cfg = config(priority_partitions=["short"])
    assert "nice" not in decide(request(), cfg, estimate=history(36000)).writes
    decision = decide(request(partition="short"), cfg, estimate=history(36000))
    assert decision.code == "partition-off" and decision.writes == {"nice": "10000"}
    # A job asking for several partitions is reordered only if all of them use the lever.
    assert "nice" not in decide(request(partition="short,gpu"), cfg,
                                estimate=history(36000)).writes


def test_nice_zero_is_not_written():
    decision = decide(request(), config(), estimate=history(3600))
    assert "nice" not in decision.writes


@pytest.mark.parametrize("policy,message", [
    ({"priority": "fifo"}, "priority must be one of none, sjf"),
    ({"sjf_nice_max": 2_000_000}, "sjf_nice_max must be between"),
    ({"sjf_nice_max": -1}, "sjf_nice_max must be between"),
    ({"sjf_reference_s": 0}, "sjf_reference_s must be positive"),
])
def test_bad_priority_settings_are_errors(policy, message):
    with pytest.raises(ConfigError, match=message):
        config(**policy)


def test_nice_is_a_writable_field_with_a_bounded_value():
    Decision(action="keep", reason="r", code="c", writes={"nice": "-1000"})
    with pytest.raises(ValueError):
        Decision(action="keep", reason="r", code="c", writes={"nice": "1e9"})
    with pytest.raises(ValueError):
        Decision(action="keep", reason="r", code="c", writes={"features": "a100"})


def test_opting_out_of_sharing_does_not_escape_the_order():
    decision = decide(request(opt_out=True), config(), estimate=history(36000))
    assert decision.code == "opt-out" and decision.writes == {"nice": "10000"}
