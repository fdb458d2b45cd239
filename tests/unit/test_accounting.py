"""sacct ingestion on output recorded from the local Slurm 22.05 cluster (tests/data/sacct/,
made by tests/data/sacct/record.py; crafted_oom.psv is an edited copy, see there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.slurm.accounting import (AccountingCache, AccountingError, JobRecord,
                                       ingest, parse_gpu_usage, node_gpu_types_from_scontrol, parse_exit,
                                       parse_json, parse_psv, parse_sacct, parse_time,
                                       parse_tres, placements_from_scontrol, resolve_gpu_types)

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"
IDS = dict(line.split("=") for line in (DATA / "awkward_ids.txt").read_text().split())


def _by_id(jobs):
    return {j.job_id: j for j in jobs}


@pytest.fixture(params=["awkward.psv", "awkward_isotime.psv", "awkward.json"])
def recorded(request):
    return request.param, _by_id(parse_sacct((DATA / request.param).read_text()))


def test_every_format_yields_the_same_jobs(recorded):
    _, jobs = recorded
    array = IDS["array"]
    het = IDS["het"]
    expected = {f"{array}_0", f"{array}_1", f"{array}_2", f"{het}+0", f"{het}+1"} | {
        IDS[k] for k in IDS if k not in ("array", "het")}
    assert set(jobs) == expected


def test_steps_fold_into_their_jobs(recorded):
    name, jobs = recorded
    steps = jobs[IDS["steps"]]
    assert [s.step_id for s in steps.steps] == ["batch", "0", "1"]
    assert all(s.state == "COMPLETED" for s in steps.steps)
    assert [s.step_id for s in jobs[f"{IDS['het']}+1"].steps] == ["0"]
    # sacct --json names a step after its program; only its id is kept.
    assert "sleep" not in json.dumps([s.step_id for j in jobs.values() for s in j.steps])


def test_array_tasks_are_jobs_sharing_one_decision(recorded):
    _, jobs = recorded
    tasks = [jobs[f"{IDS['array']}_{i}"] for i in range(3)]
    assert all(t.shared and t.shards == 8 and t.finished for t in tasks)
    assert len({t.decision_id for t in tasks}) == 1 and tasks[0].decision_id
    assert len({t.raw_id for t in tasks}) == 3  # each task has its own numeric id


def test_het_components(recorded):
    _, jobs = recorded
    gpu_part, cpu_part = jobs[f"{IDS['het']}+0"], jobs[f"{IDS['het']}+1"]
    assert gpu_part.shared and gpu_part.gpu_job
    assert not cpu_part.shared and not cpu_part.gpu_job and cpu_part.tag == ""


def test_states_exits_and_failures(recorded):
    name, jobs = recorded
    exit3 = jobs[IDS["exit3"]]
    assert exit3.state == "FAILED" and exit3.failed and not exit3.oom
    if name != "awkward.json":  # 22.05's --json reports return code 0 for this FAILED job
        assert exit3.exit_code == 3
    killed = jobs[IDS["sigkill"]]
    assert killed.signal == 9 and killed.oom_evidence == "sigkill" and killed.failed
    cancelled = jobs[IDS["cancel_running"]]
    assert cancelled.state == "CANCELLED" and cancelled.cancelled and not cancelled.failed
    assert cancelled.steps[0].signal == 15 and not cancelled.oom
    timeout = jobs[IDS["timeout"]]
    assert timeout.state == "TIMEOUT" and timeout.failed and not timeout.oom
    assert timeout.run_time_s >= 60


def test_never_started_and_running_jobs(recorded):
    _, jobs = recorded
    pending = jobs[IDS["cancel_pending"]]
    assert pending.finished and not pending.started and pending.run_time_s == 0
    assert pending.queue_delay_s is None and pending.nodes == "" and pending.shards == 0
    running = jobs[IDS["running"]]
    assert not running.finished and running.end is None and running.run_time_s is None
    # slurmdbd stores the AdminComment only at the end: a running share shows no tag yet.
    assert running.tag == "" and running.on_share


def test_untagged_jobs_and_requested_vs_allocated(recorded):
    _, jobs = recorded
    for key in ("opted_out", "no_share_partition"):
        job = jobs[IDS[key]]
        assert job.tag == "" and not job.shared and job.gpus == 1 and job.requested_gpus == 1
    cpu = jobs[IDS["cpu_only"]]
    assert not cpu.gpu_job
    share = jobs[IDS["steps"]]
    assert share.req_tres["gres/shard"] == 8 and share.alloc_tres["gres/shard"] == 8
    assert share.req_tres["mem"] == 8000 and "mem" not in share.alloc_tres


def test_other_user_and_account(recorded):
    name, jobs = recorded
    job = jobs[IDS["other_user"]]
    assert job.account == "physics" and job.shared
    # 22.05's --json leaves the user out for a user without an association.
    assert job.user == ("" if name == "awkward.json" else "nobody")


def test_psv_and_json_agree_on_times_and_tres():
    psv = _by_id(parse_psv((DATA / "awkward.psv").read_text()))
    js = _by_id(parse_json((DATA / "awkward.json").read_text()))
    iso = _by_id(parse_psv((DATA / "awkward_isotime.psv").read_text()))
    for job_id, job in psv.items():
        for other in (js[job_id], iso[job_id]):
            assert (other.submit, other.start, other.end) == (job.submit, job.start, job.end)
            assert other.state == job.state and other.tag == job.tag
            assert other.shards == job.shards and other.gpus == job.gpus


def test_crafted_out_of_memory_state():
    (job,) = parse_psv((DATA / "crafted_oom.psv").read_text())
    assert job.state == "OUT_OF_MEMORY" and job.oom_evidence == "state" and job.failed


def test_free_text_field_before_the_last_is_refused():
    # Recorded with Constraints in the middle: its "a100|v100" splits the line.
    with pytest.raises(AccountingError, match="Constraints"):
        parse_psv((DATA / "constraints_pipe.psv").read_text())


def test_pipe_inside_admin_comment_is_rejoined():
    header = "JobID|State|Start|End|AdminComment"
    text = f"{header}\n7|COMPLETED|10|20|gpushare:v1:share:id=ab12:why=x|y\n"
    (job,) = parse_psv(text)
    assert job.tag == "gpushare:v1:share:id=ab12:why=x|y"
    # The hook never writes a "|" (its admin_comment pattern): such a tag is not trusted.
    assert job.decision is None and job.decision_id == "" and not job.shared


def test_foreign_admin_comment_is_not_kept():
    (job,) = parse_psv("JobID|State|Start|End|AdminComment\n7|COMPLETED|10|20|ask bob re: model\n")
    assert job.tag == "" and not job.shared


def test_missing_fields_and_header():
    (job,) = parse_psv("JobID|State\n9|COMPLETED\n")
    assert job.start is None and job.run_time_s is None and not job.gpu_job
    with pytest.raises(AccountingError, match="header"):
        parse_psv("9|COMPLETED|1|2\n")
    with pytest.raises(AccountingError):
        parse_json('{"nothing": 1}')


def test_field_parsers():
    assert parse_tres("cpu=2,mem=16G,gres/gpu:a100=1,gres/shard=8,bad") == {
        "cpu": 2, "mem": 16384, "gres/gpu:a100": 1, "gres/shard": 8}
    assert parse_exit("0:9") == (0, 9) and parse_exit("") == (None, None)
    assert parse_time("Unknown") is None and parse_time("None") is None
    assert parse_time("1795299486") == 1795299486.0
    assert expand_hostlist("a100-[1-2],v100-1,n[08-10]") == [
        "a100-1", "a100-2", "v100-1", "n08", "n09", "n10"]


def test_gpu_type_from_the_node_it_ran_on():
    node_types = node_gpu_types_from_scontrol((DATA / "scontrol_show_nodes.txt").read_text())
    assert node_types == {"a100-1": "a100", "a100-2": "a100", "v100-1": "v100",
                          "v100-2": "v100"}
    jobs = _by_id(parse_psv((DATA / "awkward.psv").read_text()))
    resolve_gpu_types(jobs.values(), node_types)
    assert jobs[IDS["timeout"]].gpu_type == "v100"  # ran on v100-2
    assert jobs[IDS["cancel_pending"]].gpu_type == ""  # never ran; its tag allowed two types


def test_placements_from_scontrol():
    placements = placements_from_scontrol((DATA / "scontrol_show_job_d.txt").read_text())
    assert placements == {"5663_0": {("a100-2", 0)}, "5663_1": {("a100-2", 0)},
                          "5664": {("a100-2", 1)}}


def test_incremental_ingestion_asks_only_for_what_is_new(tmp_path):
    text = (DATA / "awkward.psv").read_text()
    calls = []

    def runner(since, until, as_json=False):
        calls.append((since, until))
        return text

    window = dict(since=1795290000.0, until=1795300000.0, node_types={})
    first = ingest(state_dir=tmp_path, runner=runner, **window)
    finished = [j for j in first.jobs if j.finished]
    assert first.new == len(finished) == 15
    assert [j.job_id for j in first.jobs if not j.finished] == [IDS["running"]]
    state = json.loads((tmp_path / AccountingCache.STATE).read_text())
    assert state["last_end"] == max(j.end for j in finished)

    second = ingest(state_dir=tmp_path, runner=runner, **window)
    assert second.new == 0 and len(second.jobs) == len(first.jobs)
    # The second run starts at the last end seen (less the slack for late records).
    assert calls[1][0] == state["last_end"] - 3600 and calls[0][0] == window["since"]
    # A wider window than the cache covers is read again in full.
    ingest(state_dir=tmp_path, runner=runner, since=window["since"] - 86400,
           until=window["until"], node_types={})
    assert calls[2][0] == window["since"] - 86400


def test_window_keeps_jobs_that_ended_in_it():
    jobs = ingest(sacct_file=DATA / "awkward.psv", since=0, until=1795299487.5,
                  node_types={}).jobs
    ends = {j.end for j in jobs if j.finished}
    assert ends and max(ends) <= 1795299487.5
    assert IDS["running"] in {j.job_id for j in jobs}  # running jobs stay, marked


def test_progress_bar_does_not_change_results():
    text = (DATA / "awkward.psv").read_text()
    assert [j.to_dict() for j in parse_psv(text, progress=True)] == [
        j.to_dict() for j in parse_psv(text, progress=False)]


@pytest.mark.parametrize("cut,error", [
    (lambda rows: rows[:-1] + [rows[-1].rsplit("|", 3)[0]], "truncated"),
    (lambda rows: rows + ["\x00garbage" + rows[-1][rows[-1].index("|"):]], "corrupt"),
])
def test_truncated_or_corrupt_rows_are_refused(cut, error):
    rows = (DATA / "awkward.psv").read_text().splitlines()
    with pytest.raises(AccountingError, match=error):
        parse_psv("\n".join(cut(rows)) + "\n")


def test_the_sacct_readers_records_equal_the_constructors():
    """The -P reader builds records without ``JobRecord.__init__`` (a million a month): each
    must be what the constructor makes of the same values, derived fields included."""
    from dataclasses import fields

    from slurm_gpushare.slurm.accounting import JobRecord

    for job in parse_psv((DATA / "awkward.psv").read_text()):
        made = JobRecord(**{f.name: getattr(job, f.name) for f in fields(JobRecord) if f.init})
        assert made == job and made.to_dict() == job.to_dict()
        for derived in ("shared", "gpus", "shards", "decision", "gpu_job", "on_share"):
            assert getattr(made, derived) == getattr(job, derived), (job.job_id, derived)


# Crafted (no GPU with NVML here), in the layout sites record from Slurm 23.02+ with
# AutoDetect=nvml: TRESUsageInMax on each step, gres/gpumem with a unit (bytes without one).
GPU_USAGE_PSV = (
    "JobID|JobIDRaw|State|Start|End|AllocTRES|TRESUsageInMax|AdminComment\n"
    "41|41|COMPLETED|10|70|cpu=1,gres/shard=8|"
    "|gpushare:v1:share:id=d41:shard=8:types=v100:why=history-share\n"
    "41.batch|41.batch|COMPLETED|10|70|cpu=1,gres/shard=8|cpu=00:00:50,energy=0,fs/disk=2332,"
    "gres/gpumem=9830M,gres/gpuutil=87,mem=1056K,pages=0,vmem=0|\n"
    "41.extern|41.extern|COMPLETED|10|70|cpu=1,gres/shard=8|cpu=00:00:00,energy=0,"
    "gres/gpumem=0,gres/gpuutil=0,mem=256K|\n"
    "42|42|COMPLETED|10|70|cpu=1,gres/gpu=1||\n"
    "42.batch|42.batch|COMPLETED|10|70|cpu=1,gres/gpu=1|cpu=00:00:50,mem=1056K,vmem=0|\n"
)


def test_slurm_gpu_accounting_is_read_from_the_steps():
    shared, plain = parse_psv(GPU_USAGE_PSV)
    assert shared.gpu_mem_peak_mib == 9830 and shared.gpu_util_peak_pct == 87
    assert plain.gpu_mem_peak_mib is None and plain.gpu_util_peak_pct is None  # none measured
    assert parse_gpu_usage("cpu=1,gres/gpumem=2G,gres/gpuutil=5") == (2048, 5)
    assert parse_gpu_usage("gres/gpumem=1048576,gres/gpuutil=0") == (1, 0)  # bytes
    assert parse_gpu_usage("") == (None, None)
    (recorded,) = [j for j in parse_psv((DATA / "awkward.psv").read_text()) if j.steps][:1]
    assert recorded.gpu_mem_peak_mib is None  # 22.05's recorded output has no such column
    # The cache keeps them (a report over a cached window shows the same peaks).
    assert JobRecord.from_dict(shared.to_dict()).gpu_mem_peak_mib == 9830


def test_incremental_runs_read_only_the_days_they_need(tmp_path):
    """The cache is kept by day of end: a run reads the days of its window and of what sacct
    returned, never the rest of the history (a damaged old day is not even opened)."""
    text = (DATA / "awkward.psv").read_text()
    window = dict(since=1795290000.0, until=1795300000.0, node_types={})
    first = ingest(state_dir=tmp_path, runner=lambda *a, **k: text, **window)
    cache = AccountingCache(tmp_path)
    days = cache.days()
    assert days and all(AccountingCache.day_of(j.end) in days for j in first.jobs if j.finished)
    old_day = tmp_path / AccountingCache.JOBS_DIR / "2020-01-01.jsonl"
    old_day.write_text("{not json\n")

    later = ingest(state_dir=tmp_path, runner=lambda *a, **k: text, **window)
    assert later.new == 0
    assert sorted(j.job_id for j in later.jobs) == sorted(j.job_id for j in first.jobs)
    # A window that covers the damaged day names the file to remove.
    with pytest.raises(AccountingError, match="2020-01-01.jsonl line 1 is damaged"):
        ingest(state_dir=tmp_path, runner=lambda *a, **k: text, since=1577836800.0,
               until=window["until"], node_types={})


def test_a_single_file_cache_is_split_into_days(tmp_path):
    jobs = [j for j in parse_psv((DATA / "awkward.psv").read_text()) if j.finished]
    single = tmp_path / AccountingCache.SINGLE_FILE
    single.write_text("".join(json.dumps(j.to_dict()) + "\n" for j in jobs + jobs[:2]))
    cache = AccountingCache(tmp_path)
    assert not single.exists()
    held = cache.jobs()
    assert sorted(held) == sorted(f"{j.cluster}/{j.job_id}" for j in jobs)
    assert cache.add(jobs, since=0) == 0  # nothing is new after the split
