"""The daemon's view of the cluster: nodes, their GPU type, and the shares running on them.

Refreshed in the background every few seconds; decisions read the last snapshot and never wait
for Slurm, which runs the hook under its own locks. One refresh is two Slurm calls whatever the
cluster's size: ``sinfo`` for the nodes and ``squeue -t R -O ...`` for the running jobs, whose
AdminComment tag (``...:class=N:...``) gives each share's interference class (one call, not one
``scontrol show job`` per share). Not ``squeue --json``: in 22.05 it ignores filters and returns
every job slurmctld holds (24 MB for 7,700 jobs), and parsing that holds the GIL long enough to
make decisions miss the hook's deadline. The snapshot is built off to the side and swapped in
whole; decisions made on one snapshot memoise their node exclusions in it (``Snapshot.memo``).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from dataclasses import replace

from slurm_gpushare.core.config import Config
from slurm_gpushare.core.policy import NodeView, incompatible_nodes
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.slurm import cmd

log = logging.getLogger("slurm_gpushare.daemon.clusterview")

SINFO_NODES = ["sinfo", "-h", "-N", "-o", "%N|%f|%P|%G"]
# Running jobs with their AdminComment (free text: last, split off at most 3 times). A field
# size of 0 prints the value unpadded and uncut.
SQUEUE_RUNNING = ["squeue", "-h", "-t", "R", "-O",
                  "JobID:0|,NodeList:0|,tres-per-node:0|,admin_comment:0"]
_SHARED = re.compile(r"(^|[,:/])(shard|mps)[:/]")
_GPUS = re.compile(r"(?:^|,)gpu:(?:[^:,(]+:)?(\d+)")
# Decisions share the GIL with the refresh thread: it hands the GIL over after this long, and
# yields it outright every YIELD_EVERY lines it reads (the OS may run it again before a waiting
# decision otherwise, on a busy host).
GIL_SWITCH_S = 0.001
YIELD_EVERY = 500


class Snapshot(tuple):
    """The nodes as one refresh saw them (never changed), plus answers computed from them."""

    def __new__(cls, nodes=()):
        snapshot = super().__new__(cls, nodes)
        snapshot.memo = {}  # policy.incompatible_nodes' answers on this snapshot
        return snapshot


def parse_nodes(sinfo_out: str, config: Config) -> dict[str, tuple[str, tuple[str, ...], int]]:
    """node -> (GPU type, partitions, GPUs) from ``SINFO_NODES``' output; the type is found
    among the node's features."""
    by_feature = {g.feature: g.name for g in config.gpu_types}
    nodes: dict[str, tuple[str, set[str], int]] = {}
    for line in sinfo_out.splitlines():
        name, features, partition, gres = (line.split("|") + ["", "", ""])[:4]
        gpu_type = next((by_feature[f] for f in features.split(",") if f in by_feature), "")
        gpus = sum(int(m.group(1)) for m in _GPUS.finditer(gres))
        entry = nodes.setdefault(name, (gpu_type, set(), gpus))
        entry[1].add(partition.rstrip("*"))
    return {name: (gpu_type, tuple(sorted(parts)), gpus)
            for name, (gpu_type, parts, gpus) in nodes.items()}


def share_of_line(line: str) -> tuple[str, str, str] | None:
    """(job id, node, AdminComment) of a running share in a ``SQUEUE_RUNNING`` line; None for
    anything else (whole GPUs, jobs on several nodes, malformed lines)."""
    if "shard" not in line and "mps" not in line:
        return None
    parts = line.split("|", 3)
    if len(parts) < 3:
        return None
    job_id, node, tres = parts[0].strip(), parts[1].strip(), parts[2]
    # Shares are single-node jobs asking for a sharing gres.
    if node and "," not in node and "[" not in node and _SHARED.search(tres):
        return job_id, node, parts[3].strip() if len(parts) == 4 else ""
    return None


def running_shares(squeue_out: str) -> dict[str, tuple[str, str]]:
    """job id -> (node, AdminComment) of the running shares in ``SQUEUE_RUNNING``'s output."""
    shares = {}
    for line in squeue_out.splitlines():
        share = share_of_line(line)
        if share:
            shares[share[0]] = share[1:]
    return shares


def class_of_comment(admin_comment: str) -> int | None:
    """A share's class from its AdminComment tag; None when untagged or classless."""
    tag = Tag.decode(admin_comment)
    return tag.job_class if tag else None


class _Fixed:
    """A ClusterView of one snapshot."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot

    def nodes(self) -> Snapshot:
        return self.snapshot


class SlurmClusterView:
    """A policy.ClusterView backed by Slurm, refreshed on a background thread."""

    def __init__(self, config: Config, *, interval_s: float = 5.0):
        self.config = config
        self.interval_s = interval_s
        self._snapshot = Snapshot()
        self._sinfo_out: str | None = None  # the last sinfo output
        # squeue line -> (node, class) of the share it shows, or None: a refresh parses only
        # the lines that changed since the last one (jobs that started, ended or were retagged).
        self._lines: dict[str, tuple[str, int | None] | None] = {}
        self._residents: dict[str, list[int]] = {}  # node -> classes of its shares (known)
        self._position: dict[str, int] = {}  # node -> its index in the snapshot
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def nodes(self) -> Snapshot:
        return self._snapshot

    def refresh(self) -> bool:
        """Two Slurm calls; work in proportion to what changed since the last refresh; the new
        snapshot replaces the old one in one assignment."""
        sinfo_out = cmd.output(SINFO_NODES, timeout=10.0)
        queue = cmd.output(SQUEUE_RUNNING, timeout=20.0)
        if not sinfo_out or queue is None:
            return False
        nodes = list(self._snapshot)
        if sinfo_out != self._sinfo_out:  # nodes rarely change: rebuild only when they do
            node_info = parse_nodes(sinfo_out, self.config)
            self._lines, self._residents = {}, {}
            nodes = [NodeView(name=name, gpu_type=gpu_type, partitions=parts, gpus=gpus)
                     for name, (gpu_type, parts, gpus) in sorted(node_info.items()) if gpu_type]
            self._position = {node.name: i for i, node in enumerate(nodes)}
            self._sinfo_out = sinfo_out
        old, lines, changed = self._lines, {}, set()
        for number, line in enumerate(queue.splitlines()):
            if number % YIELD_EVERY == 0:
                time.sleep(0)  # let a waiting decision have the GIL (and the CPU) now
            if line in old:
                lines[line] = old.pop(line)
                continue
            share = share_of_line(line)
            lines[line] = None
            if share:
                job_class = class_of_comment(share[2])
                lines[line] = (share[1], job_class)
                if job_class is not None:
                    self._residents.setdefault(share[1], []).append(job_class)
                    changed.add(share[1])
        for gone in old.values():  # lines no longer there: jobs that ended
            if gone and gone[1] is not None:
                self._residents[gone[0]].remove(gone[1])
                changed.add(gone[0])
        self._lines = lines
        for name in changed:
            if name in self._position:
                i = self._position[name]
                nodes[i] = replace(nodes[i], resident_classes=tuple(self._residents[name]))
        snapshot = Snapshot(nodes)
        self._warm(snapshot, self._snapshot.memo)
        self._snapshot = snapshot
        return True

    def _warm(self, snapshot: Snapshot, previous: dict) -> None:
        """Answer on the new snapshot, here on the refresh thread, what decisions asked of the
        old one: a decision then never loops over the nodes itself."""
        by_name = {g.name: g for g in self.config.gpu_types}
        view = _Fixed(snapshot)
        for (job_class, types, partitions), (knowledge, _excluded, _n) in list(previous.items()):
            fits = [by_name[name] for name in types if name in by_name]
            incompatible_nodes(job_class, fits, list(partitions), view, knowledge)

    def start(self) -> None:
        # Hand the GIL to a waiting decision within GIL_SWITCH_S, not Python's default 5 ms.
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
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
