"""The daemon's view of the cluster: nodes, their GPU type, and the shares running on them.

Also the idle GPUs per node (for "share only under pressure"), from the same running jobs.
Refreshed in the background every few seconds; decisions read the last snapshot and never wait
for Slurm, which runs the hook under its own locks. Running shares come from ``squeue -t R``
(jobs whose TRES ask for shard or mps); each share's interference class is read once from its
AdminComment tag (``...:class=N:...``, ``scontrol show job``) and cached. Not ``squeue --json``:
in 22.05 it ignores filters and returns every job slurmctld holds (24 MB for 7,700 jobs), and
parsing that holds the GIL long enough to make decisions miss the hook's deadline.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import replace
from typing import Sequence

from slurm_gpushare.core import tres as tresmod
from slurm_gpushare.core.config import Config
from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.core.policy import NodeView
from slurm_gpushare.slurm import cmd
from slurm_gpushare.slurm.jobs import lookup_job

log = logging.getLogger("slurm_gpushare.daemon.clusterview")


def read_nodes(config: Config, timeout: float = 10.0) -> dict[str, tuple[str, tuple[str, ...], int]]:
    """node -> (GPU type, partitions, GPUs), the type found among the node's features."""
    out = cmd.output(["sinfo", "-h", "-N", "-o", "%N|%f|%P|%G"], timeout=timeout)
    if out is None:
        return {}
    by_feature = {g.feature: g.name for g in config.gpu_types}
    nodes: dict[str, tuple[str, set[str], int]] = {}
    for line in out.splitlines():
        name, features, partition, gres = (line.split("|") + ["", "", ""])[:4]
        gpu_type = next((by_feature[f] for f in features.split(",") if f in by_feature), "")
        gpus = sum(int(m.group(1)) for m in re.finditer(r"(?:^|,)gpu:(?:[^:,(]+:)?(\d+)", gres))
        entry = nodes.setdefault(name, (gpu_type, set(), gpus))
        entry[1].add(partition.rstrip("*"))
    return {name: (gpu_type, tuple(sorted(parts)), gpus)
            for name, (gpu_type, parts, gpus) in nodes.items()}


def running_shares(squeue_out: str) -> dict[str, str]:
    """job id -> node of running shares, from ``squeue -h -t R -o '%i|%N|%b'``."""
    shares = {}
    for line in squeue_out.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) != 3:
            continue
        job_id, node, tres = parts
        # Shares are single-node jobs asking for a sharing gres.
        if re.search(r"(^|[,:/])(shard|mps)[:/]", tres) and node and "," not in node \
                and "[" not in node:
            shares[job_id] = node
    return shares


def idle_gpus_per_node(nodes: dict[str, tuple[str, tuple[str, ...], int]], squeue_out: str,
                       up: set[str]) -> dict[str, int]:
    """node -> GPUs holding no job, from running jobs (``squeue -h -t R -o '%i|%N|%b'``).

    Whole-GPU jobs take their count on each of their nodes; a share is counted as taking a GPU
    of its own (it may share one with another share: idle GPUs are never over-counted). Nodes
    not in ``up`` (down, drained, reserved for maintenance) have none.
    """
    busy: dict[str, int] = {}
    for line in squeue_out.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) != 3 or not parts[1]:
            continue
        try:
            tokens = tresmod.parse(parts[2])
        except tresmod.TresError:
            continue
        used = sum(t.count for t in tresmod.find(tokens, "gpu"))
        if any(t.name in ("shard", "mps") for t in tokens):
            used += 1
        if used:
            for node in expand_hostlist(parts[1]):
                busy[node] = busy.get(node, 0) + used
    return {name: (max(0, gpus - busy.get(name, 0)) if name in up else 0)
            for name, (_, _, gpus) in nodes.items()}


def nodes_up(timeout: float = 10.0) -> set[str] | None:
    """Nodes that can start jobs now (sinfo states idle, mixed, allocated)."""
    out = cmd.output(["sinfo", "-h", "-N", "-t", "idle,mixed,allocated", "-o", "%N"],
                     timeout=timeout)
    return None if out is None else {line.strip() for line in out.splitlines() if line.strip()}


def resident_classes(shares: dict[str, str], classes: dict[str, int | None]) -> dict[str, list[int]]:
    """node -> classes of the running shares on it (shares of unknown class are left out)."""
    residents: dict[str, list[int]] = {}
    for job_id, node in shares.items():
        if classes.get(job_id) is not None:
            residents.setdefault(node, []).append(int(classes[job_id]))
    return residents


def class_of_job(job_id: str) -> int | None:
    """A share's class from its AdminComment tag; None when untagged or classless."""
    job = lookup_job(job_id)
    return job.tag.job_class if job and job.tag else None


class SlurmClusterView:
    """A policy.ClusterView backed by Slurm, refreshed on a background thread."""

    def __init__(self, config: Config, *, interval_s: float = 5.0):
        self.config = config
        self.interval_s = interval_s
        self._nodes: tuple[NodeView, ...] = ()
        self._classes: dict[str, int | None] = {}  # job id -> class, read once per share
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def nodes(self) -> Sequence[NodeView]:
        return self._nodes

    def claim_idle(self, gpu_types: Sequence[str]) -> None:
        """A job was kept whole for an idle GPU of one of these types: count one such GPU as
        taken until the next refresh, so a burst of submissions does not send every job after
        the same idle GPU (the rest share instead)."""
        nodes = list(self._nodes)
        for i, node in enumerate(nodes):
            if node.idle_gpus and node.gpu_type in gpu_types:
                nodes[i] = replace(node, idle_gpus=node.idle_gpus - 1)
                self._nodes = tuple(nodes)
                return

    def refresh(self) -> bool:
        node_info = read_nodes(self.config)
        queue = cmd.output(["squeue", "-h", "-t", "R", "-o", "%i|%N|%b"], timeout=20.0)
        if not node_info or queue is None:
            return False
        shares = running_shares(queue)
        self._classes = {job: self._classes[job] for job in shares if job in self._classes}
        for job_id in shares.keys() - self._classes.keys():
            self._classes[job_id] = class_of_job(job_id)
        residents = resident_classes(shares, self._classes)
        up = nodes_up()
        idle = idle_gpus_per_node(node_info, queue, up) if up is not None else {}
        self._nodes = tuple(
            NodeView(name=name, gpu_type=gpu_type, partitions=parts, gpus=gpus,
                     resident_classes=tuple(residents.get(name, ())),
                     idle_gpus=idle.get(name))
            for name, (gpu_type, parts, gpus) in sorted(node_info.items()) if gpu_type)
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cluster-view", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 -- a bad snapshot keeps the previous one
                log.exception("cluster-view-refresh-failed")
            self._stop.wait(self.interval_s)
