"""The daemon's view of the cluster: nodes (GPU type, partitions, features, state), reservations,
and the shares running on them.

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
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from slurm_gpushare.core import tres as tresmod
from slurm_gpushare.core.config import Config
from slurm_gpushare.core.feasibility import state_usable
from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.core.policy import NodeView
from slurm_gpushare.slurm import cmd
from slurm_gpushare.slurm.jobs import lookup_job

log = logging.getLogger("slurm_gpushare.daemon.clusterview")


@dataclass(frozen=True)
class NodeInfo:
    gpu_type: str
    partitions: tuple[str, ...]
    gpus: int
    features: tuple[str, ...]  # active features
    state: str  # sinfo %t, e.g. "idle", "mix", "drain", "down*"


def parse_sinfo_nodes(out: str, config: Config) -> dict[str, NodeInfo]:
    """node -> NodeInfo from ``sinfo -h -N -o '%N|%b|%P|%G|%t'`` (one line per node and
    partition); the GPU type is the configured type whose feature the node has."""
    by_feature = {g.feature: g.name for g in config.gpu_types}
    nodes: dict[str, NodeInfo] = {}
    for line in out.splitlines():
        name, features, partition, gres, state = (line.split("|") + ["", "", "", ""])[:5]
        if not name:
            continue
        feature_list = tuple(f for f in features.split(",") if f and f != "(null)")
        gpu_type = next((by_feature[f] for f in feature_list if f in by_feature), "")
        gpus = sum(int(m.group(1)) for m in re.finditer(r"(?:^|,)gpu:(?:[^:,(]+:)?(\d+)", gres))
        old = nodes.get(name)
        parts = (old.partitions if old else ()) + ((partition.rstrip("*"),) if partition else ())
        nodes[name] = NodeInfo(gpu_type, tuple(sorted(set(parts))), gpus, feature_list, state)
    return nodes


def read_nodes(config: Config, timeout: float = 10.0) -> dict[str, NodeInfo]:
    """The cluster's nodes, in one sinfo call (empty when Slurm does not answer)."""
    out = cmd.output(["sinfo", "-h", "-N", "-o", "%N|%b|%P|%G|%t"], timeout=timeout)
    return parse_sinfo_nodes(out, config) if out is not None else {}


def parse_reservations(out: str) -> dict[str, tuple[str, ...]]:
    """reservation -> nodes, from ``scontrol -o show reservation``."""
    found = {}
    for line in out.splitlines():
        name = re.search(r"(?:^|\s)ReservationName=(\S+)", line)
        nodes = re.search(r"(?:^|\s)Nodes=(\S+)", line)
        if name:
            listed = nodes.group(1) if nodes and nodes.group(1) != "(null)" else ""
            found[name.group(1)] = tuple(expand_hostlist(listed)) if listed else ()
    return found


def read_reservations(timeout: float = 10.0) -> dict[str, tuple[str, ...]] | None:
    out = cmd.output(["scontrol", "-o", "show", "reservation"], timeout=timeout)
    if out is None:
        return None
    return parse_reservations(out)


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


def idle_gpus_per_node(gpus_of: Mapping[str, int], squeue_out: str,
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
            for name, gpus in gpus_of.items()}


def resident_classes(shares: dict[str, str], classes: dict[str, int | None]) -> dict[str, list[int]]:
    """node -> classes of the running shares on it (shares of unknown class are left out)."""
    residents: dict[str, list[int]] = {}
    for job_id, node in shares.items():
        if classes.get(job_id) is not None:
            residents.setdefault(node, []).append(int(classes[job_id]))
    return residents


def class_of_job(job_id: str) -> int | None:
    """A share's class from its AdminComment tag; None when untagged or classless."""
    return tag_of_job(job_id)[0]


def tag_of_job(job_id: str) -> tuple[int | None, str]:
    """A share's class and decision id from its AdminComment tag ((None, "") when untagged)."""
    job = lookup_job(job_id)
    if not (job and job.tag):
        return None, ""
    return job.tag.job_class, job.decision_id or ""


class SlurmClusterView:
    """A policy.ClusterView backed by Slurm, refreshed on a background thread."""

    def __init__(self, config: Config, *, interval_s: float = 5.0):
        self.config = config
        self.interval_s = interval_s
        self._nodes: tuple[NodeView, ...] = ()
        # Every node's features and partitions (GPU nodes or not), for config checks on reload.
        self.all_features: frozenset[str] = frozenset()
        self.all_partitions: frozenset[str] = frozenset()
        self._reservations: dict[str, tuple[str, ...]] = {}
        self._classes: dict[str, int | None] = {}  # job id -> class, read once per share
        self._decisions: dict[str, str] = {}  # job id -> decision id (the pair predictor's key)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def nodes(self) -> Sequence[NodeView]:
        return self._nodes

    def reservations(self) -> Mapping[str, tuple[str, ...]]:
        """reservation name -> its nodes (feasibility.check reads it for --reservation)."""
        return self._reservations

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
        self._decisions = {job: self._decisions[job] for job in shares if job in self._decisions}
        for job_id in shares.keys() - self._classes.keys():
            self._classes[job_id], self._decisions[job_id] = tag_of_job(job_id)
        residents = resident_classes(shares, self._classes)
        decisions: dict[str, list[str]] = {}
        for job_id, node in shares.items():
            if self._decisions.get(job_id):
                decisions.setdefault(node, []).append(self._decisions[job_id])
        self.all_features = frozenset(f for info in node_info.values() for f in info.features)
        self.all_partitions = frozenset(p for info in node_info.values() for p in info.partitions)
        reservations = read_reservations()
        if reservations is not None:
            self._reservations = reservations
        up = {name for name, info in node_info.items() if state_usable(info.state)}
        idle = idle_gpus_per_node({name: info.gpus for name, info in node_info.items()}, queue, up)
        self._nodes = tuple(
            NodeView(name=name, gpu_type=info.gpu_type, partitions=info.partitions,
                     gpus=info.gpus, resident_classes=tuple(residents.get(name, ())),
                     resident_jobs=tuple(decisions.get(name, ())),
                     features=info.features, state=info.state, idle_gpus=idle.get(name))
            for name, info in sorted(node_info.items()) if info.gpu_type)
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
            # Until the nodes are known every decision keeps its job: ask again soon.
            self._stop.wait(self.interval_s if self._nodes else min(1.0, self.interval_s))
