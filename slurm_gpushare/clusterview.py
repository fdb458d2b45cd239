"""The daemon's view of the cluster: nodes, their GPU type, and the shares running on them.

Refreshed in the background (``squeue --json`` and ``sinfo``) every few seconds; decisions read
the last snapshot and never wait for Slurm, which runs the hook under its own locks. A running
share's interference class comes from its AdminComment tag (``...:class=N:...``).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
from typing import Sequence

from .config import Config
from .policy import NodeView
from .slurmjobs import parse_tag

log = logging.getLogger("slurm_gpushare.clusterview")


def _run(argv: list[str], timeout: float) -> str | None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def read_nodes(config: Config, timeout: float = 10.0) -> dict[str, tuple[str, tuple[str, ...], int]]:
    """node -> (GPU type, partitions, GPUs), the type found among the node's features."""
    out = _run(["sinfo", "-h", "-N", "-o", "%N|%f|%P|%G"], timeout)
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


def resident_classes(squeue_json: str) -> dict[str, list[int]]:
    """node -> classes of the running shares on it, from ``squeue --json`` output."""
    residents: dict[str, list[int]] = {}
    for job in json.loads(squeue_json).get("jobs", []):
        if job.get("job_state") != "RUNNING":
            continue
        fields = parse_tag(job.get("admin_comment") or "")
        if fields.get("action") != "share" or "class" not in fields:
            continue
        node = job.get("nodes") or ""
        if node and "," not in node and "[" not in node:  # shares are single-node jobs
            residents.setdefault(node, []).append(int(fields["class"]))
    return residents


class SlurmClusterView:
    """A policy.ClusterView backed by Slurm, refreshed on a background thread."""

    def __init__(self, config: Config, *, interval_s: float = 5.0):
        self.config = config
        self.interval_s = interval_s
        self._nodes: tuple[NodeView, ...] = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def nodes(self) -> Sequence[NodeView]:
        return self._nodes

    def refresh(self) -> bool:
        node_info = read_nodes(self.config)
        queue = _run(["squeue", "--json"], 20.0)
        if not node_info or queue is None:
            return False
        try:
            residents = resident_classes(queue)
        except (ValueError, TypeError):
            return False
        self._nodes = tuple(
            NodeView(name=name, gpu_type=gpu_type, partitions=parts, gpus=gpus,
                     resident_classes=tuple(residents.get(name, ())))
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
