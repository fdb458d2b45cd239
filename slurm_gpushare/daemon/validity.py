"""Is a decision valid for *this* cluster? Checked by the daemon before it answers.

The policy decides from the configuration; the configuration can be wrong (a GPU type's
feature misspelt, a partition renamed). A share Slurm cannot satisfy is rejected at submission,
so a decision is sent only if every GPU type it constrains the job to is a real feature of a
candidate node (from the daemon's view of the cluster), its count is at least 1 and at most
what one GPU of each of those types holds, and it carries its tag. Otherwise the job is kept as
submitted. A reload whose GPU types or partitions the cluster does not know is refused.
"""

from __future__ import annotations

from typing import Sequence

from slurm_gpushare.core import tres as tresmod
from slurm_gpushare.core.config import Config
from slurm_gpushare.core.policy import NodeView, capacity
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.core.types import Decision, JobRequest


def decision_problem(decision: Decision, request: JobRequest, config: Config,
                     nodes: Sequence[NodeView]) -> str | None:
    """Why the decision cannot be written for this cluster, or None when it can."""
    if decision.action != "share":
        return None
    tag = Tag.decode(decision.writes.get("admin_comment", ""))
    if tag is None or not tag.shared:
        return "share without its tag"
    try:
        tokens = [t for t in tresmod.parse(decision.writes.get("tres_per_node", ""))
                  if t.name in ("shard", "mps")]
    except tresmod.TresError:
        return "unparsable share"
    if len(tokens) != 1:
        return "share without exactly one shard/mps request"
    types = [config.gpu_type(name) for name in decision.gpu_types]
    if not types or None in types:
        return "share on GPU types the configuration does not know"
    count = tokens[0].count
    most = min(capacity(g) for g in types)
    if not 1 <= count <= most:
        return f"share count {count} outside 1..{most}"
    if nodes:
        known = partition_features(nodes, request.partition or "")
        missing = sorted(g.feature for g in types if g.feature not in known)
        if missing:
            return f"feature(s) {', '.join(missing)} on no node of the job's partition"
    return None


def partition_features(nodes: Sequence[NodeView], partition: str) -> frozenset[str]:
    """The features of the nodes in the job's partitions (``--partition``, comma-separated;
    empty: all nodes). Kept in a daemon snapshot's ``checks``: answered once per snapshot."""
    checks = getattr(nodes, "checks", None)
    key = ("partition-features", partition)
    if checks is not None and key in checks:
        return checks[key]
    partitions = set(p for p in partition.split(",") if p)
    known = frozenset(f for n in nodes if not partitions or partitions & set(n.partitions)
                      for f in n.features)
    if checks is not None:
        checks[key] = known
    return known


def config_problem(config: Config, features: frozenset[str],
                   partitions: frozenset[str]) -> str | None:
    """Why this configuration would make invalid decisions on a cluster with these node
    features and partitions (None if it would not, or if the cluster is not known yet)."""
    if not features and not partitions:
        return None
    missing = sorted(g.feature for g in config.gpu_types if g.feature not in features)
    if missing:
        return f"GPU type feature(s) {', '.join(missing)} on no node"
    unknown = sorted(p for p in config.policy.sharing_partitions if p not in partitions)
    if unknown:
        return f"sharing partition(s) {', '.join(unknown)} do not exist"
    return None
