"""Requeue a share that outgrew its memory, re-sized, a bounded number of times.

Requeue does not run job_submit again: a job requeued as it is comes back with the same
undersized share and overruns again, forever. So the job is held while requeued, its request
is re-sized from the peak its collector saw (plus the hint margin) -- or turned back into a
whole GPU when that peak does not fit a share of the GPU types it may run on -- its tag is
rewritten to match, and it is released. A job already requeued ``policy.max_requeues`` times
is left to run (and logged): the limit stops a loop whatever else goes wrong.

    scontrol requeuehold <job>
    scontrol update JobId=<job> TresPerNode=gres:shard:<N> AdminComment=<new tag>
    scontrol release <job>
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from slurm_gpushare.core.config import Config
from slurm_gpushare.core.policy import capacity
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.slurm import cmd
from slurm_gpushare.slurm.jobs import SlurmJob


@dataclass(frozen=True)
class Resize:
    tres_per_node: str  # the job's new request
    tag: Tag  # its new AdminComment tag
    whole_gpu: bool


def resize(tag: Tag, peak_mib: float, config: Config) -> Resize:
    """The request a share that peaked at ``peak_mib`` gets on its next run."""
    types = [g for g in (config.gpu_type(name) for name in tag.types) if g is not None]
    shard_mib = config.shares.shard_mib
    need = math.ceil(peak_mib * (1 + config.policy.hint_margin) / shard_mib)
    shard_types = [g for g in types if g.sharing == "shard"]
    if tag.shard is not None and shard_types and need <= min(capacity(g) for g in shard_types):
        new_tag = replace(tag, shard=need, why="requeue-resized",
                          mem_mib=None if shard_mib == 1024 else need * shard_mib)
        return Resize(f"gres:shard:{need}", new_tag, whole_gpu=False)
    # Does not fit a share (or an MPS share, whose memory limit cannot be raised in place).
    typed = f"{types[0].name}:" if len(types) == 1 else ""
    new_tag = Tag("keep", "requeue-whole-gpu", tag.decision_id, types=tag.types,
                  job_class=tag.job_class)
    return Resize(f"gres:gpu:{typed}1", new_tag, whole_gpu=True)


def requeue_resized(job: SlurmJob, peak_mib: float, config: Config) -> tuple[bool, str]:
    """Requeue ``job`` with its share re-sized. Returns (done, what happened)."""
    tag = job.tag
    if tag is None or not tag.shared:
        return False, "not a share"
    if job.restarts >= config.policy.max_requeues:
        return False, f"already requeued {job.restarts} times (policy.max_requeues)"
    plan = resize(tag, peak_mib, config)
    held = cmd.run(["scontrol", "requeuehold", job.job_id])
    if not held.ok:
        return False, f"requeuehold failed: {(held.stderr or held.stdout).strip()[:200]}"
    updated = cmd.run(["scontrol", "update", f"JobId={job.job_id}",
                       f"TresPerNode={plan.tres_per_node}", f"AdminComment={plan.tag.encode()}"])
    released = cmd.run(["scontrol", "release", job.job_id])
    if not updated.ok:
        return False, (f"re-size failed, requeued unchanged: "
                       f"{(updated.stderr or updated.stdout).strip()[:200]}")
    if not released.ok:
        return False, f"re-sized but still held: {(released.stderr or released.stdout).strip()[:200]}"
    return True, (f"requeued as a whole GPU ({plan.tres_per_node})" if plan.whole_gpu
                  else f"requeued with {plan.tres_per_node}")
