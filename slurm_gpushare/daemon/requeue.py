"""Requeue a share that outgrew its memory, re-sized, a bounded number of times.

Requeue does not run job_submit again: a job requeued as it is comes back with the same
undersized share and overruns again, forever. So the job is held while requeued, its request
is re-sized from the peak its collector saw (plus the hint margin), its tag is rewritten to
match, and it is released. A job already requeued ``policy.max_requeues`` times is left to run
(and logged): the limit stops a loop whatever else goes wrong.

    scontrol requeuehold <job>
    scontrol update JobId=<job> TresPerNode=gres:shard:<N> [Features=<narrower>] AdminComment=<tag>
    scontrol release <job>

The job keeps its shared gres: Slurm 22.05 cannot turn a queued share back into a whole GPU
(``TresPerNode=gres:gpu:1`` is refused as an invalid gres specification, and an update adds to
the job's gres rather than replacing them). A peak that outgrew the smallest of its types moves
the share to the types whose GPUs hold it (``Features`` narrowed, the user's constraint kept);
one that no share holds gets all of the largest GPU (every shard, or 100% MPS, no memory limit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from slurm_gpushare.core.config import Config
from slurm_gpushare.core.policy import MPS_PER_GPU, capacity, retype_features
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.slurm import cmd
from slurm_gpushare.slurm.jobs import SlurmJob


@dataclass(frozen=True)
class Resize:
    tres_per_node: str  # the job's new request
    tag: Tag  # its new AdminComment tag
    whole_gpu: bool  # all of one GPU (no other share fits beside it)
    features: str | None = None  # its new constraint; None: unchanged


def resize(tag: Tag, peak_mib: float, config: Config, features: str = "") -> Resize | str:
    """The request a share that peaked at ``peak_mib`` gets on its next run (``features``: the
    job's constraint now); a reason where none can be made."""
    types = [g for g in (config.gpu_type(name) for name in tag.types) if g is not None]
    if not types:
        return f"none of its types ({', '.join(tag.types) or 'none'}) is configured"
    if tag.mps is not None:
        # An MPS share's memory limit is the tag's: all of the GPU, without a limit.
        whole = Tag("keep", "requeue-whole-gpu", tag.decision_id, types=tag.types,
                    job_class=tag.job_class)
        return Resize(f"gres:mps:{MPS_PER_GPU}", whole, whole_gpu=True)
    shard_mib = config.shares.shard_mib
    need = math.ceil(peak_mib * (1 + config.policy.hint_margin) / shard_mib)
    holders = [g for g in types if need <= capacity(g)]
    if holders:
        units, whole_gpu = need, False
    else:  # no GPU holds the peak and its margin: the largest GPU, whole
        largest = max(capacity(g) for g in types)
        holders, units, whole_gpu = [g for g in types if capacity(g) == largest], largest, True
    narrowed = None
    if len(holders) < len(types):
        narrowed = retype_features(features, types, holders)
        if narrowed is None:
            return (f"its constraint ({features or 'none'}) is not the one its decision wrote: "
                    f"cannot move it to {', '.join(g.name for g in holders)}")
    names = tuple(g.name for g in holders)
    if whole_gpu:
        new_tag = Tag("keep", "requeue-whole-gpu", tag.decision_id, types=names,
                      job_class=tag.job_class)
    else:
        new_tag = replace(tag, shard=need, types=names, why="requeue-resized",
                          mem_mib=None if shard_mib == 1024 else need * shard_mib)
    return Resize(f"gres:shard:{units}", new_tag, whole_gpu=whole_gpu, features=narrowed)


def requeue_resized(job: SlurmJob, peak_mib: float, config: Config) -> tuple[bool, str]:
    """Requeue ``job`` with its share re-sized. Returns (done, what happened)."""
    tag = job.tag
    if tag is None or not tag.shared:
        return False, "not a share"
    if job.restarts >= config.policy.max_requeues:
        return False, f"already requeued {job.restarts} times (policy.max_requeues)"
    plan = resize(tag, peak_mib, config, job.features)
    if isinstance(plan, str):
        return False, plan
    held = cmd.run(["scontrol", "requeuehold", job.job_id])
    if not held.ok:
        return False, f"requeuehold failed: {(held.stderr or held.stdout).strip()[:200]}"
    updated = cmd.run(["scontrol", "update", f"JobId={job.job_id}",
                       f"TresPerNode={plan.tres_per_node}",
                       *([f"Features={plan.features}"] if plan.features is not None else []),
                       f"AdminComment={plan.tag.encode()}"])
    released = cmd.run(["scontrol", "release", job.job_id])
    if not updated.ok:
        return False, (f"re-size failed, requeued unchanged: "
                       f"{(updated.stderr or updated.stdout).strip()[:200]}")
    if not released.ok:
        return False, f"re-sized but still held: {(released.stderr or released.stdout).strip()[:200]}"
    return True, (f"requeued as a whole GPU ({plan.tres_per_node})" if plan.whole_gpu
                  else f"requeued with {plan.tres_per_node}")
