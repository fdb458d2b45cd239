"""Telemetry: scenario replay, the sampler's summaries, the NVML adapter's failure handling,
process attribution, and the prolog/epilog collector."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import types


from conftest import wait_for
from slurm_gpushare.node import agent
from slurm_gpushare.daemon.store import Store
from slurm_gpushare.node.telemetry import ScenarioProvider, open_provider
from slurm_gpushare.node.telemetry.nvml import NvmlProvider, job_of_pid
from slurm_gpushare.node.telemetry.sampler import SUMMARY_FIELDS, JobSampler


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def replay(profile, job_id="7", gpus=(0,), steps=8, dt=1.0):
    """Sample a profile ``steps`` times, ``dt`` seconds apart, on a fake clock."""
    clock = FakeClock()
    wall = FakeClock()
    provider = ScenarioProvider(profile, job_id=job_id, clock=clock, wall=wall)
    sampler = JobSampler(provider, job_id, gpus, cluster="c1", clock=clock)
    for _ in range(steps):
        sampler.sample_once()
        clock.now += dt
        wall.now += dt
    return sampler.summaries()


ALONE = {"gpus": [{"index": 0, "name": "Tesla V100-SXM2-16GB", "mem_total_mib": 16000,
                   "phases": [
                       {"duration_s": 4, "util_gpu": 40, "util_mem": 10, "mem_used_mib": 4000,
                        "sm_clock_mhz": 1300},
                       {"duration_s": 4, "util_gpu": 80, "util_mem": 30, "mem_used_mib": 8000,
                        "sm_clock_mhz": 1500, "fail": ["util_mem"]}]}]}


def test_alone_summary_from_device_readings():
    (s,) = replay(ALONE)
    assert set(s) == set(SUMMARY_FIELDS)
    assert (s["mgup_max"], s["mgup_mean"]) == (80.0, 60.0)
    assert (s["mgmap_max_mib"], s["mgmap_max_pct"]) == (8000.0, 50.0)
    # util_mem failed during the second phase: the max and mean come from the first only
    assert (s["mgtsamp_max"], s["mgtsamp_mean"]) == (10.0, 10.0)
    assert s["samples"] == 8 and s["duration_s"] == 7.0
    assert s["gpu_model"] == "Tesla V100-SXM2-16GB" and s["sm_clock_max_mhz"] == 1500.0
    assert s["gpm_sm_occupancy_mean"] is None  # not in the profile: not available
    assert s["shared"] is False and s["coruns"] == []
    assert "no-process-list" in s["conditions"]


SHARED = {"gpus": [{"index": 0, "name": "A100", "mem_total_mib": 40000, "phases": [
    {"duration_s": 3, "util_gpu": 50, "util_mem": 20, "mem_used_mib": 6000,
     "processes": [{"pid": 10, "job_id": "self", "used_mib": 6000, "sm_util": 50, "mem_util": 20}]},
    {"duration_s": 5, "util_gpu": 95, "util_mem": 60, "mem_used_mib": 20000,
     "processes": [{"pid": 10, "job_id": "self", "used_mib": 7000, "sm_util": 45, "mem_util": 25},
                   {"pid": 20, "job_id": "8", "used_mib": 13000, "sm_util": 50, "mem_util": 35},
                   {"pid": 30, "used_mib": 500, "sm_util": 0, "mem_util": 0}]}]}]}


def test_shared_gpu_is_attributed_per_process_with_coruns():
    (s,) = replay(SHARED, job_id="7")
    assert s["shared"] is True and s["attribution"] == "device+process"
    assert s["mgup_max"] == 50.0  # never the device's 95%: that includes job 8
    assert s["mgmap_max_mib"] == 7000.0 and s["mgtsamp_max"] == 25.0
    assert {c["job_id"]: c["overlap_s"] for c in s["coruns"]} == {"8": 5.0, "other": 5.0}


def test_lost_gpu_is_a_condition_not_a_crash():
    profile = json.loads(json.dumps(ALONE))
    profile["gpus"][0]["lost_after_s"] = 3
    profile["gpus"].append({"index": 1, "mem_total_mib": 1000,
                            "phases": [{"util_gpu": 5, "mem_used_mib": 10}]})
    s0, s1 = replay(profile, gpus=(0, 1))
    assert "gpu-lost" in s0["conditions"] and s0["samples"] == 3
    assert s0["mgup_max"] == 40.0
    assert s1["samples"] == 8 and s1["conditions"] == ["no-process-list"]


def test_a_failing_provider_never_raises():
    class Broken:
        def sample(self, index):
            raise RuntimeError("driver hiccup")

    sampler = JobSampler(Broken(), "1", [0])
    sampler.sample_once()
    (s,) = sampler.summaries()
    assert s["samples"] == 0 and s["conditions"] == ["sample-error:RuntimeError"]


def test_run_stops_on_event_and_when_all_gpus_are_lost():
    profile = {"gpus": [{"index": 0, "lost_after_s": 0.05, "phases": [{"util_gpu": 1}]}]}
    sampler = JobSampler(ScenarioProvider(profile), "1", [0], interval_s=0.01)
    started = time.monotonic()
    sampler.run(threading.Event())  # returns by itself: the only GPU is lost
    assert time.monotonic() - started < 5
    assert "gpu-lost" in sampler.summaries()[0]["conditions"]


def test_scenario_from_toml_and_env(tmp_path, monkeypatch):
    path = tmp_path / "p.toml"
    path.write_text('[[gpus]]\nindex = 0\n[[gpus.phases]]\nutil_gpu = 12\n'
                    '[[gpus.phases.processes]]\npid = 5\njob_id = "self"\n')
    monkeypatch.setenv("GPUSHARE_TELEMETRY_SCENARIO", str(path))
    provider = open_provider(job_id="99")
    assert isinstance(provider, ScenarioProvider)
    assert provider.job_of_pid(5) == "99" and provider.sample(0).util_gpu == 12.0


def test_job_of_pid_from_environ_and_cgroup(tmp_path):
    def proc(pid, environ=None, cgroup=None):
        d = tmp_path / str(pid)
        d.mkdir()
        if environ is not None:
            (d / "environ").write_bytes(environ)
        if cgroup is not None:
            (d / "cgroup").write_text(cgroup)

    proc(1, environ=b"PATH=/bin\0SLURM_JOB_ID=4242\0HOME=/x\0")
    proc(2, cgroup="0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n")
    proc(3, cgroup="12:devices:/slurm/uid_1000/job_88/step_batch\n")
    proc(4, environ=b"PATH=/bin\0", cgroup="0::/user.slice\n")
    assert [job_of_pid(p, tmp_path) for p in (1, 2, 3, 4, 5)] == ["4242", "77", "88", None, None]


def fake_pynvml(lost_after=None, fail=()):
    """A stand-in for the pynvml module: the adapter's failure paths without a GPU."""
    nv = types.SimpleNamespace()

    class NVMLError(Exception):
        def __init__(self, value):
            self.value = value

    calls = {"n": 0}
    nv.NVMLError = NVMLError
    nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_GPU_NOT_FOUND, nv.NVML_CLOCK_SM = 15, 28, 1
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"

    def guard(name, value):
        def fn(*args):
            if lost_after is not None and calls["n"] > lost_after:
                raise NVMLError(15)
            if name in fail:
                raise NVMLError(3)  # not supported
            return value
        return fn

    def rates(handle):
        calls["n"] += 1
        return guard("rates", types.SimpleNamespace(gpu=70, memory=20))()

    nv.nvmlDeviceGetUUID = guard("uuid", b"GPU-abc")
    nv.nvmlDeviceGetName = guard("name", "NVIDIA H100")
    nv.nvmlDeviceGetUtilizationRates = rates
    nv.nvmlDeviceGetMemoryInfo = guard("memory", types.SimpleNamespace(used=2 << 30,
                                                                        total=80 << 30))
    nv.nvmlDeviceGetClockInfo = guard("clock", 1980)
    nv.nvmlDeviceGetComputeRunningProcesses = guard(
        "procs", [types.SimpleNamespace(pid=10, usedGpuMemory=1 << 30),
                  types.SimpleNamespace(pid=11, usedGpuMemory=(1 << 64) - 1)])

    def process_util(handle, since):
        return [types.SimpleNamespace(pid=10, timeStamp=since + 5, smUtil=60, memUtil=15)]

    nv.nvmlDeviceGetProcessUtilization = process_util

    def no_gpm(handle):
        raise NVMLError(3)

    nv.nvmlGpmQueryDeviceSupport = no_gpm
    return nv


def test_nvml_adapter_per_metric_failure_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail=("memory", "clock")))
    provider = NvmlProvider()
    s = provider.sample(0)
    assert (s.util_gpu, s.util_mem, s.name, s.uuid) == (70.0, 20.0, "NVIDIA H100", "GPU-abc")
    assert s.mem_used_mib is None and s.sm_clock_mhz is None and not s.lost
    assert s.gpm_sm_occupancy is None and s.gpm_dram_bw_util is None
    by_pid = {p.pid: p for p in s.processes}
    assert by_pid[10].used_mib == 1024.0 and by_pid[10].sm_util == 60.0
    assert by_pid[11].used_mib is None and by_pid[11].sm_util is None  # NOT_AVAILABLE, no sample
    provider.close()


def test_nvml_adapter_lost_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(lost_after=2))
    provider = NvmlProvider()
    sampler = JobSampler(provider, "5", [0])
    for _ in range(4):
        sampler.sample_once()
    (s,) = sampler.summaries()
    assert s["samples"] == 2 and s["conditions"] == ["gpu-lost"] and s["mgup_max"] == 70.0


# -- the collector ------------------------------------------------------------------------
def test_collect_delivers_one_summary_per_gpu(tmp_path):
    provider = ScenarioProvider(SHARED, job_id="7")
    got = []
    stop = threading.Event()
    stop.set()  # one sample, then stop
    n = agent.collect("7", "0", provider=provider, deliver=got.append, stop=stop, cluster="c1")
    assert n == 1 and got[0]["job_id"] == "7" and got[0]["samples"] == 1


def test_collect_skips_gpu_indices_the_node_does_not_have(tmp_path):
    provider = ScenarioProvider(SHARED, job_id="7")
    present = provider.device_indices()
    got, logs = [], []
    stop = threading.Event()
    stop.set()
    given = ",".join(str(i) for i in [*present, 5000])
    n = agent.collect("7", given, provider=provider, deliver=got.append, stop=stop,
                      cluster="c1", log=logs.append)
    assert n == len(present) and sorted(s["gpu_index"] for s in got) == present
    assert any("5000" in line and "not on this node" in line for line in logs)


def test_collect_without_telemetry_or_gpus_does_nothing(monkeypatch):
    monkeypatch.delenv("GPUSHARE_TELEMETRY_SCENARIO", raising=False)
    monkeypatch.setattr("slurm_gpushare.node.telemetry.open_provider", lambda *a, **k: None)
    logs = []
    assert agent.collect("7", "0", deliver=lambda s: None, stop=threading.Event(),
                         log=logs.append) == 0
    assert "no GPU telemetry" in logs[0]
    provider = ScenarioProvider(ALONE)
    assert agent.collect("7", "", provider=provider, deliver=lambda s: None,
                         stop=threading.Event(), log=logs.append) == 0


def serve_once(path, reply):
    """A one-shot daemon stand-in: reads one line, answers ``reply``."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    received = []

    def handle():
        conn, _ = server.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                data += conn.recv(65536)
            received.append(json.loads(data))
            conn.sendall(json.dumps(reply).encode() + b"\n")
        server.close()

    thread = threading.Thread(target=handle, daemon=True)
    thread.start()
    return received, thread


def test_default_delivery_sends_ingest_or_spools(tmp_path):
    sock = tmp_path / "d.sock"
    summary = {"job_id": "9", "gpu_index": 0, "cluster": "c1", "mgup_max": 1.0}
    received, thread = serve_once(sock, {"v": 1, "ok": True, "new": True})
    deliver = agent.default_deliver(str(sock), tmp_path / "spool")
    assert deliver(summary) == "sent"
    thread.join(5)
    assert received == [{"v": 1, "op": "ingest", "summary": summary}]
    # a refusal or no daemon at all: spooled, and a later drain into the store ingests it
    received, thread = serve_once(tmp_path / "e.sock", {"v": 1, "ok": False, "error": "busy"})
    assert agent.default_deliver(str(tmp_path / "e.sock"), tmp_path / "spool")(summary) == "spooled"
    assert deliver(summary | {"job_id": "10"}) == "spooled"
    spooled = sorted(p.name for p in (tmp_path / "spool").iterdir())
    assert spooled == ["c1-10-0.json", "c1-9-0.json"]
    with Store(tmp_path / "s.db") as store:
        assert agent.drain_spool(tmp_path / "spool", store.ingest_summary) == (2, 0)
        assert len(store.all_summaries()) == 2
    assert list((tmp_path / "spool").iterdir()) == []


def collector_args(tmp_path, job_id: str) -> tuple:
    """The agent's state dir and the arguments of a collector for GPU 0 fed by the SHARED
    scenario, with no daemon to deliver to (summaries are spooled)."""
    scenario = tmp_path / "profile.json"
    scenario.write_text(json.dumps(SHARED))
    state = tmp_path / "state"
    return state, ["--job-id", job_id, "--gpus", "0", "--cluster", "c1", "--state-dir",
                   str(state), "--socket", str(tmp_path / "absent.sock"), "--scenario",
                   str(scenario), "--interval", "0.05"]


def test_prolog_start_and_epilog_stop_are_idempotent_and_exit_0(tmp_path):
    state, common = collector_args(tmp_path, "31")
    started = time.monotonic()
    assert agent.main(["start", *common]) == 0
    assert agent.main(["start", *common]) == 0  # already running: no second collector
    assert time.monotonic() - started < 3  # the prolog is not held up
    pidfile = agent.pid_path(state, "31")
    pid = int(pidfile.read_text().split()[0])
    assert wait_for(lambda: b"collector" in (state / "agent.log").read_bytes())

    def sampled_twice() -> bool:  # its first checkpoint (after ~2 s) says how far it got
        saved = agent.checkpoint_path(state, "31")
        return saved.exists() and json.loads(saved.read_text() or "[]")[0]["samples"] >= 2

    assert wait_for(sampled_twice, timeout=30)
    assert agent.main(["stop", *common, "--wait", "10"]) == 0
    assert wait_for(lambda: (agent.spool_dir(state) / "c1-31-0.json").exists())
    assert not pidfile.exists()
    assert agent.main(["stop", *common]) == 0  # nothing to stop: still fine
    summary = json.loads((agent.spool_dir(state) / "c1-31-0.json").read_text())
    assert summary["samples"] >= 2 and summary["mgup_max"] == 50.0
    log = (state / "agent.log").read_text()
    assert log.count("collector started") == 1 and "already running" in log
    assert f"pid {pid}" in log


def test_bad_invocations_still_exit_0(tmp_path):
    state = str(tmp_path / "st")
    assert agent.main(["start", "--job-id", "", "--state-dir", state]) == 0
    assert agent.main(["frobnicate"]) == 0
    assert agent.main(["stop", "--job-id", "../../etc", "--state-dir", state]) == 0
    assert not (tmp_path / "st" / "agent").exists()


def test_pid_alive_guards_pid_zero_and_dead_pids():
    import os
    import subprocess
    import sys

    from slurm_gpushare.core.files import pid_alive

    assert pid_alive(os.getpid())
    assert not pid_alive(0)  # kill(0, 0) would "succeed" on our own process group
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)
    assert not pid_alive(int(done.stdout))


def test_a_reused_pid_is_not_the_process_that_had_it():
    import os

    from slurm_gpushare.core.files import pid_alive, process_started

    started = process_started(os.getpid())
    assert started is not None and pid_alive(os.getpid(), started)
    # The same pid with another start time: a later process that the kernel gave the pid to.
    assert not pid_alive(os.getpid(), started + 1)


def test_a_pid_file_without_a_start_time_names_only_a_collector(tmp_path):
    import signal
    import subprocess

    state, common = collector_args(tmp_path, "34")
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        agent.pid_path(state, "34").parent.mkdir(parents=True, exist_ok=True)
        agent.pid_path(state, "34").write_text(f"{stranger.pid}\n")
        assert agent.main(["stop", *common]) == 0
        assert stranger.poll() is None  # not the agent: left alone
        assert "died before the epilog" in (state / "agent.log").read_text()
    finally:
        stranger.send_signal(signal.SIGKILL)
        stranger.wait()


def test_the_epilog_never_signals_a_process_that_took_a_dead_collectors_pid(tmp_path):
    import signal
    import subprocess

    from slurm_gpushare.core.files import process_started

    state, common = collector_args(tmp_path, "33")
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        # The collector (started at some other time) died; its pid now names `stranger`.
        started = process_started(stranger.pid)
        agent.pid_path(state, "33").parent.mkdir(parents=True, exist_ok=True)
        agent.pid_path(state, "33").write_text(f"{stranger.pid} {started - 1}\n")
        assert agent.main(["start", *common]) == 0  # not "already running": a new collector
        log = (state / "agent.log").read_text()
        assert "already running" not in log and "collector started" in log
        assert agent.main(["stop", *common, "--wait", "10"]) == 0
        # The new collector was stopped; and with a stale file naming the stranger, stop
        # leaves it alone and says the collector died.
        agent.pid_path(state, "33").write_text(f"{stranger.pid} {started - 1}\n")
        assert agent.main(["stop", *common]) == 0
        assert stranger.poll() is None
        assert f"(pid {stranger.pid}) died before the epilog" in (state / "agent.log").read_text()
    finally:
        stranger.send_signal(signal.SIGKILL)
        stranger.wait()


def test_overrun_watch_reports_once_when_the_peak_passes_the_share():
    from slurm_gpushare.node.agent import overrun_watch

    class Sampler:
        def __init__(self):
            self.peak = None

        def peak_mib(self):
            return self.peak

    sent, sampler = [], Sampler()
    watch = overrun_watch("42", 8192.0, sent.append, lambda message: None)
    for peak in (None, 4000.0, 8192.0, 9000.0, 12000.0):
        sampler.peak = peak
        watch(sampler)
    assert sent == [{"v": 1, "op": "overrun", "job_id": "42", "peak_mib": 9000.0,
                     "limit_mib": 8192.0}]


def test_a_failing_report_does_not_stop_the_watch():
    from slurm_gpushare.node.agent import overrun_watch

    class Sampler:
        def peak_mib(self):
            return 9000.0

    logged = []

    def broken(message):
        raise OSError("daemon gone")

    overrun_watch("42", 8192.0, broken, logged.append)(Sampler())
    assert "report failed" in logged[0]


def test_an_epilog_right_after_the_prolog_still_gets_its_summary(tmp_path):
    """A job shorter than the collector's start-up: the epilog's SIGTERM arrives while the
    collector is still importing. It must wait (blocked) and be handled, not kill it."""
    state, common = collector_args(tmp_path, "32")
    assert agent.main(["start", *common]) == 0
    assert agent.main(["stop", *common, "--wait", "30"]) == 0  # no pause: SIGTERM at once
    assert wait_for(lambda: (agent.spool_dir(state) / "c1-32-0.json").exists())
    summary = json.loads((agent.spool_dir(state) / "c1-32-0.json").read_text())
    assert summary["samples"] >= 1


def test_an_exited_process_not_yet_reaped_is_not_alive():
    # A fake GPU registration or a collector pid file of a zombie must not count as running.
    import os
    import subprocess

    from slurm_gpushare.core.files import pid_alive

    child = subprocess.Popen(["true"])
    assert wait_for(lambda: open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0]
                    == "Z")
    assert not pid_alive(child.pid)
    child.wait()
    assert pid_alive(os.getpid())


def test_a_share_whose_first_question_to_slurmctld_goes_unanswered_is_still_collected(monkeypatch):
    # Shards on 22.05 come with no GPU variables: the collector asks slurmctld. A busy slurmctld
    # (a burst of submissions) may not answer the first time; while the job runs, ask again.
    monkeypatch.setenv("SLURMD_NODENAME", "v100-1")
    answers = iter([None, None, [0]])  # None: no answer (scontrol failed or timed out)
    asked = []

    def gpu_indices(job_id, node, timeout=10.0):
        asked.append((job_id, node))
        return next(answers)

    monkeypatch.setattr("slurm_gpushare.slurm.jobs.gpu_indices", gpu_indices)
    monkeypatch.setattr(agent, "GPU_QUESTION_WAIT_S", 0.01)
    got = []
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    n = agent.collect("7", None, provider=ScenarioProvider(SHARED, job_id="7"),
                      deliver=got.append, stop=stop, interval_s=0.05)
    assert n == 1 and got[0]["gpu_index"] == 0 and got[0]["samples"] >= 1
    assert asked == [("7", "v100-1")] * 3


def test_a_job_with_no_gpu_on_this_node_asks_slurmctld_once(monkeypatch):
    # A multi-node job's prolog runs on every node; slurmctld's answer that the job holds no
    # GPU here is final (asking again every 0.5 s for the job's life would load slurmctld).
    monkeypatch.setenv("SLURMD_NODENAME", "v100-1")
    asked = []
    monkeypatch.setattr("slurm_gpushare.slurm.jobs.gpu_indices",
                        lambda job_id, node, timeout=10.0: asked.append(job_id) or [])
    monkeypatch.setattr(agent, "GPU_QUESTION_WAIT_S", 0.01)
    logs = []
    assert agent.collect("7", None, provider=ScenarioProvider(ALONE), deliver=lambda s: None,
                         stop=threading.Event(), log=logs.append) == 0
    assert asked == ["7"] and "no GPUs given" in logs[-1]


def test_asking_slurmctld_for_the_gpus_stops_when_the_job_ends_or_after_a_bound(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "v100-1")
    asked = []
    monkeypatch.setattr("slurm_gpushare.slurm.jobs.gpu_indices",
                        lambda job_id, node, timeout=10.0: asked.append(job_id) or None)
    monkeypatch.setattr(agent, "GPU_QUESTION_WAIT_S", 0.01)
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()  # the job ends (the epilog's stop)
    logs = []
    assert agent.collect("7", None, provider=ScenarioProvider(ALONE), deliver=lambda s: None,
                         stop=stop, log=logs.append) == 0
    assert 1 < len(asked) <= agent.GPU_QUESTIONS and "no GPUs given" in logs[-1]
    asked.clear()  # a job that runs on while slurmctld never answers: a bounded number of tries
    assert agent.collect("7", None, provider=ScenarioProvider(ALONE), deliver=lambda s: None,
                         stop=threading.Event(), log=logs.append) == 0
    assert len(asked) == agent.GPU_QUESTIONS


def test_a_stop_signal_while_the_collector_holds_its_stop_event_lock_still_stops_it(tmp_path):
    # The epilog's SIGTERM may come while the main thread is inside stop.wait, holding the
    # event's own lock. A handler setting the event there deadlocked the collector: alive,
    # asked to stop, its summary never delivered (a CI run lost a job's telemetry that way).
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text(
        "import os, signal, threading, time\n"
        "from slurm_gpushare.node import agent\n"
        "stop = threading.Event()\n"
        "agent.stop_on_signals(stop)\n"
        "with stop._cond:  # what the main thread holds inside stop.wait\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.2)\n"
        "print('stopped' if stop.wait(5) else 'not stopped', flush=True)\n")
    probe = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = probe.communicate(timeout=20)
    finally:
        probe.kill()  # a deadlocked probe ignores SIGTERM: only SIGKILL ends it
    assert out.strip() == "stopped"


def test_what_the_collector_starts_can_still_be_stopped_by_a_signal(tmp_path):
    # The collector starts the spool drainer. Keeping the stop signals blocked to wait for
    # them passed that mask on: a drainer that SIGTERM could not stop.
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text(
        "import subprocess, threading\n"
        "from slurm_gpushare.node import agent\n"
        "agent.stop_on_signals(threading.Event())\n"
        "print(subprocess.run(['grep', 'SigBlk', '/proc/self/status'], capture_output=True,\n"
        "                     text=True).stdout, flush=True)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=20).stdout
    blocked = int(out.split()[1], 16)
    for signum in agent.STOP_SIGNALS:
        assert not blocked & (1 << (signum - 1)), signum
