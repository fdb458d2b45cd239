"""An array's id names one task; its GPUs and record are that task's own (slurm/jobs.py).

The scontrol output below is what 22.05.8 printed on the test cluster for a running 3-task
array 12 (``scontrol show job -d 12`` lists every task; task 2 kept the id 12).
"""

from __future__ import annotations

from slurm_gpushare.slurm import cmd, jobs

DETAIL = """JobId=12 ArrayJobId=12 ArrayTaskId=2 JobName=wrap
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   JOB_GRES=gpu:a100:1
     Nodes=a100-1 CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:0)

JobId=14 ArrayJobId=12 ArrayTaskId=1 JobName=wrap
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   JOB_GRES=gpu:t4:1
     Nodes=t4-1 CPU_IDs=1 Mem=0 GRES=gpu:t4:1(IDX:1)

JobId=13 ArrayJobId=12 ArrayTaskId=0 JobName=wrap
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   JOB_GRES=gpu:t4:1
     Nodes=t4-1 CPU_IDs=0 Mem=0 GRES=gpu:t4:1(IDX:0)
"""
ONE_LINE = ("JobId=12 ArrayJobId=12 ArrayTaskId=2 JobName=wrap UserId=root(0) JobState=RUNNING "
            "NodeList=a100-1 AdminComment=gpushare:v1:keep:id=aa:why=first-run\n"
            "JobId=14 ArrayJobId=12 ArrayTaskId=1 JobName=wrap UserId=bob(1001) "
            "JobState=RUNNING NodeList=t4-1\n")


def test_an_array_id_gives_only_its_own_tasks_gpus(monkeypatch):
    # scontrol show hostnames <one node> prints that node.
    monkeypatch.setattr(cmd, "output", lambda argv, **kw: DETAIL if "-d" in argv else argv[-1])
    assert jobs.gpu_indices("12", "a100-1") == [0]
    assert jobs.gpu_indices("12", "t4-1") == []  # tasks 0 and 1 are other jobs
    assert jobs.gpu_indices("12_1", "t4-1") == [1]
    assert jobs.gpu_indices("13", "t4-1") == [0]
    assert jobs.gpu_indices("15", "t4-1") is None  # no record of it: slurmctld did not say


def test_no_answer_from_slurmctld_is_not_an_answer_of_no_gpus(monkeypatch):
    monkeypatch.setattr(cmd, "output", lambda argv, **kw: None)  # failed or timed out
    assert jobs.gpu_indices("12", "a100-1") is None


def test_lookup_of_an_array_id_is_the_task_that_kept_it(monkeypatch):
    monkeypatch.setattr(cmd, "output", lambda argv, **kw: ONE_LINE)
    job = jobs.lookup_job("12")
    assert (job.uid, job.nodes, job.decision_id) == (0, "a100-1", "aa")
    assert jobs.lookup_job("12_1").uid == 1001


def test_lookup_reads_the_jobs_constraint(monkeypatch):
    # The requeue narrows it (daemon/requeue.py); "(null)" is no constraint.
    line = ("JobId=20 JobName=wrap UserId=bob(1001) JobState=RUNNING NodeList=a100-1 "
            "Features=ib&(v100|a100) DelayBoot=00:00:00 AdminComment=gpushare:v1:share:id=bb:"
            "shard=5:types=v100+a100:why=hint-share\n")
    monkeypatch.setattr(cmd, "output", lambda argv, **kw: line)
    assert jobs.lookup_job("20").features == "ib&(v100|a100)"
    monkeypatch.setattr(cmd, "output",
                        lambda argv, **kw: line.replace("ib&(v100|a100)", "(null)"))
    assert jobs.lookup_job("20").features == ""
