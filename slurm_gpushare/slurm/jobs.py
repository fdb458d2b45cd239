"""One job's Slurm record, as the daemon and user tools need it (never on the submit path).

``scontrol -o show job`` while slurmctld still holds the job, ``sacct -P`` afterwards
(``SLURM_TIME_FORMAT=%s``, free-text AdminComment last).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_gpushare.core.hostlist import expand_hostlist, expand_ranges
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.slurm import cmd


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    uid: int | None
    admin_comment: str = ""
    state: str = ""
    nodes: str = ""
    restarts: int = 0  # times Slurm requeued it (scontrol's Restarts=)
    features: str = ""  # its constraint (scontrol's Features=; "" where none or unknown)

    @property
    def tag(self) -> Tag | None:
        return Tag.decode(self.admin_comment)

    @property
    def decision_id(self) -> str:
        tag = self.tag
        return tag.decision_id if tag else ""


def own_records(out: str, job_id: str) -> list[str]:
    """The records of ``scontrol show job [-o] [-d] <job_id>`` output that are this job's own.

    Asked for an array's id, scontrol answers with every task of the array; one of them (the
    task that kept the array's id as its job id) is the job itself, the others are other jobs
    with their own GPUs, telemetry and co-runs. ``<array>_<task>`` names one task.
    """
    records = [r for r in re.split(r"\n(?=JobId=)", out.strip()) if r.strip()] if out else []
    array = re.fullmatch(r"(\d+)_(\d+)", job_id)
    het = re.fullmatch(r"(\d+)\+(\d+)", job_id)
    if array:
        wanted = re.compile(rf"\bArrayJobId={array.group(1)}\s+ArrayTaskId={array.group(2)}\b")
    elif het:  # a heterogeneous job's component: its own JobId, named by leader + offset
        wanted = re.compile(rf"\bHetJobId={het.group(1)}\s+HetJobOffset={het.group(2)}\b")
    else:
        wanted = re.compile(rf"^JobId={job_id}\b")
    return [r for r in records if wanted.search(r)]


def lookup_job(job_id: str, timeout: float = 5.0) -> SlurmJob | None:
    if not re.fullmatch(r"\d+(_\d+)?(\+\d+)?", job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    out = cmd.output(["scontrol", "-o", "show", "job", job_id], timeout=timeout, epoch_times=True)
    own = own_records(out or "", job_id)
    if own:
        line = own[0]
        uid = re.search(r"\bUserId=\S*?\((\d+)\)", line)
        state = re.search(r"\bJobState=(\S+)", line)
        nodes = re.search(r"\bNodeList=(\S+)", line)
        restarts = re.search(r"\bRestarts=(\d+)", line)
        features = re.search(r"\bFeatures=(\S+)", line)
        # AdminComment is free text; in -o output it runs to the next " Key=" field.
        comment = re.search(r"\bAdminComment=(.*?)(?= \w+=|$)", line)
        return SlurmJob(job_id, int(uid.group(1)) if uid else None,
                        comment.group(1).strip() if comment else "",
                        state.group(1) if state else "",
                        nodes.group(1) if nodes and nodes.group(1) != "(null)" else "",
                        int(restarts.group(1)) if restarts else 0,
                        features.group(1) if features and features.group(1) != "(null)" else "")
    out = cmd.output(["sacct", "-n", "-P", "-X", "-j", job_id, "-o",
                      "JobID,UID,State,NodeList,AdminComment"], timeout=timeout, epoch_times=True)
    if out and out.strip():
        fields = out.splitlines()[0].split("|", 4)
        if len(fields) == 5:
            return SlurmJob(job_id, int(fields[1]) if fields[1].isdigit() else None,
                            fields[4], fields[2], fields[3])
    return None


# One node's GRES in ``scontrol show job -d``: ``Nodes=n1 CPU_IDs=0 Mem=0 GRES=<spec>``.
_GRES_LINE = re.compile(r"Nodes=(\S+) [^\n]*?GRES=(\S*)")
# A whole GPU: ``gpu:a100:2(IDX:0-1)`` (both versions); a share: ``shard:8(IDX:0)`` in 22.05,
# ``shard:20(20/80,0/80)`` (allocated/total on each GPU, in index order) from 23.x on.
_GRES_ITEM = re.compile(r"(gpu|shard|mps)[^(,]*\((?:IDX:([\d,\-]+)|([\d/,]+))\)")


def gres_placements(detail: str) -> list[tuple[str, list[int]]]:
    """(node list, GPU indices) for each ``Nodes=... GRES=...`` line of ``scontrol show job -d``
    (one job's block), in both Slurm 22.05's and 24.11's spelling."""
    out = []
    for nodes, spec in _GRES_LINE.findall(detail):
        indices: set[int] = set()
        for _, idx, per_gpu in _GRES_ITEM.findall(spec):
            if idx:
                indices.update(expand_ranges(idx))
            else:
                indices.update(i for i, pair in enumerate(per_gpu.split(","))
                               if pair.partition("/")[0].isdigit() and int(pair.partition("/")[0]))
        if indices:
            out.append((nodes, sorted(indices)))
    return out


def gpu_indices(job_id: str, node: str, timeout: float = 10.0) -> list[int] | None:
    """GPU indices a job holds on one node, from ``scontrol show job -d``; None when
    slurmctld gave no record of the job (the command failed or timed out).

    The fallback when Slurm sets neither SLURM_JOB_GPUS nor CUDA_VISIBLE_DEVICES (shards on
    22.05, file-backed test GPUs): lines like ``Nodes=n1 CPU_IDs=0 Mem=0 GRES=shard:8(IDX:0)``
    (22.05) or ``GRES=shard:8(8/16,0/16)`` (24.11).
    """
    records = own_records(
        cmd.output(["scontrol", "show", "job", "-d", job_id], timeout=timeout) or "", job_id)
    if not records:
        return None
    indices: set[int] = set()
    for nodes, found in gres_placements("\n".join(records)):
        if nodes == node or node in expand_hostlist(nodes):
            indices.update(found)
    return sorted(indices)
