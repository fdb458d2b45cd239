"""Records the sacct fixtures in this folder from the running local test cluster.

    .venv/bin/python tests/data/sacct/record.py

Submits a set of awkward jobs (array, heterogeneous, steps, exit 3, SIGKILL, cancelled while
running and while pending, still running, timeout, opted out, another user and account),
waits until they settle and writes what slurmdbd returns for them, unedited:

- ``awkward.psv``: ``sacct -a -P -o <FIELDS>`` with ``SLURM_TIME_FORMAT=%s``;
- ``awkward_isotime.psv``: the same with Slurm's default time format;
- ``awkward.json``: ``sacct -a --json`` (22.05, openapi dbv0.0.38 layout).

With ``GPUSHARE_SLURM=24.11`` the same goes into ``24.11/`` from the 24.11 test cluster, with
``scontrol show job -d`` of running jobs (a whole GPU, a shard and an MPS share) and
``squeue --json`` / ``sinfo --json`` beside them.

``crafted_oom.psv`` is NOT recorded: a state OUT_OF_MEMORY needs cgroups, which the test
cluster does not use, so it is the SIGKILL job's lines with State and ExitCode edited to what
Slurm writes for a cgroup OOM kill (``OUT_OF_MEMORY``, ``0:125``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from slurm_gpushare.slurm.accounting import SACCT_FIELDS  # noqa: E402
from devcluster.cluster import TestCluster  # noqa: E402

WORKDIR = Path("/tmp/gpushare-capture")


def main() -> None:
    cluster = TestCluster()
    # 22.05's files sit in this folder; another version's in a subfolder named after it.
    HERE = Path(__file__).resolve().parent
    if cluster.slurm_version != "22.05":
        HERE = HERE / cluster.slurm_version
        HERE.mkdir(exist_ok=True)
    cluster.start()
    WORKDIR.mkdir(exist_ok=True)
    WORKDIR.chmod(0o1777)
    common = (f"--chdir={WORKDIR}", f"--output={WORKDIR}/%j.out")

    def submit(*args: str, script: str, user: str | None = None) -> str:
        argv = cluster.in_root(["sbatch", "--parsable", *common, *args], user=user)
        result = subprocess.run(argv, input=script, capture_output=True, text=True,
                                env=cluster.env(), check=True)
        return result.stdout.strip().split(";")[0]

    sleep = "#!/bin/sh\nsleep {}\n"
    ids = {
        "array": submit("--array=0-2", "--gres=gpu:1", script=sleep.format(2)),
        "het": submit(script="#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH hetjob\n#SBATCH -n1\n"
                             "srun --het-group=1 sleep 1\nsleep 1\n"),
        "steps": submit("--gres=gpu:1", script="#!/bin/sh\nsrun sleep 1\nsrun true\n"),
        "exit3": submit("--gres=gpu:1", script="#!/bin/sh\nsleep 1\nexit 3\n"),
        "sigkill": submit("--gres=gpu:1", script="#!/bin/sh\nsleep 1\nkill -9 $$\n"),
        "cancel_running": submit("--gres=gpu:1", script=sleep.format(60)),
        "cancel_pending": submit("--gres=gpu:1", "--begin=now+3600", script=sleep.format(1)),
        "timeout": submit("--gres=gpu:1", "--time=1", script=sleep.format(300)),
        "opted_out": submit("--gres=gpu:1", "--comment=gpushare=off", script=sleep.format(2)),
        "no_share_partition": submit("--gres=gpu:1", "-p", "gpu-excl", script=sleep.format(2)),
        "other_user": submit("--gres=gpu:1", "-A", "physics", script=sleep.format(2),
                             user="nobody"),
        "cpu_only": submit(script=sleep.format(1)),
        "running": submit("--gres=gpu:1", script=sleep.format(600)),
    }
    cluster.wait_state(ids["cancel_running"], {"RUNNING"})
    cluster.slurm("scancel", ids["cancel_running"])
    cluster.slurm("scancel", ids["cancel_pending"])
    cluster.wait_state(ids["running"], {"RUNNING"})
    if cluster.slurm_version != "22.05":
        # GPU lines of running jobs: a whole GPU, a share of each kind.
        shares = [submit("--gres=shard:6", "-w", "v100-1", script=sleep.format(30)),
                  submit("--gres=mps:50", "-w", "t4-1", script=sleep.format(30))]
        for job_id in shares:
            cluster.wait_state(job_id, {"RUNNING"})
        detail = "".join(cluster.slurm("scontrol", "show", "job", "-d", job_id).stdout
                         for job_id in (ids["running"], *shares))
        (HERE / "scontrol_show_job_d.txt").write_text(detail)
        (HERE / "squeue.json").write_text(cluster.slurm("squeue", "--json").stdout)
        (HERE / "sinfo.json").write_text(cluster.slurm("sinfo", "--json").stdout)
        cluster.slurm("scancel", *shares)
    # The timeout job ends last (limit 1 min + slurmctld's check interval).
    cluster.wait_state(ids["timeout"], {"TIMEOUT"}, timeout=240)
    settle = [i for k, i in ids.items() if k not in ("running",)]
    for job_id in settle:
        cluster.sacct(job_id, "JobID,State", timeout=60)
    time.sleep(2)  # let the last step records reach slurmdbd

    # Array and het jobs are selected by their first id; every id goes on one -j list.
    selector = ",".join(ids.values())
    fields = ",".join(SACCT_FIELDS)
    psv = cluster.slurm("sacct", "-a", "-P", "-o", fields, "-j", selector,
                        env={"SLURM_TIME_FORMAT": "%s"}).stdout
    (HERE / "awkward.psv").write_text(psv)
    iso = cluster.slurm("sacct", "-a", "-P", "-o", fields, "-j", selector).stdout
    (HERE / "awkward_isotime.psv").write_text(iso)
    js = cluster.slurm("sacct", "-a", "--json", "-j", selector).stdout
    (HERE / "awkward.json").write_text(js)
    (HERE / "awkward_ids.txt").write_text("".join(f"{k}={v}\n" for k, v in ids.items()))
    cluster.slurm("scancel", ids["running"])
    print("recorded", len(psv.splitlines()) - 1, "lines for",
          ", ".join(f"{k}={v}" for k, v in ids.items()))


if __name__ == "__main__":
    main()
