"""The daemon's cluster view: O(1) Slurm calls per refresh, whole snapshots swapped in, and
node exclusions memoised per snapshot."""

from __future__ import annotations

import threading

from slurm_gpushare.core.config import parse_config
from slurm_gpushare.core.policy import incompatible_nodes
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.daemon import clusterview
from slurm_gpushare.slurm import cmd

CONFIG = parse_config({"policy": {"sharing_partitions": ["gpu"]},
                       "gpu_types": {"v100": {"memory_gib": 16, "feature": "v100"},
                                     "a100": {"memory_gib": 80, "feature": "a100"}}})


class FakeSlurm:
    """sinfo and squeue outputs of a cluster of ``nodes`` nodes; counts the calls."""

    def __init__(self, nodes: int, shares: dict[str, tuple[str, int]]):
        self.calls: list[tuple[str, ...]] = []
        self.nodes = nodes
        self.shares = shares  # job id -> (node, class)

    def run(self, argv, **_kwargs):
        argv = tuple(argv)
        self.calls.append(argv)
        if argv[0] == "sinfo":
            out = "\n".join(f"n{i}|{'a100' if i % 2 else 'v100'},ib|gpu*|gpu:4"
                            for i in range(self.nodes))
        elif argv[0] == "squeue":
            lines = [f"{job}|{node}|gres:shard:8|" + Tag("share", "history", decision_id="d",
                                                         shard=8, job_class=cls).encode()
                     for job, (node, cls) in self.shares.items()]
            out = "\n".join(lines + ["9999|n1|gres:gpu:1|(null)"])
        else:
            return cmd.Result(argv, 1, "", "unexpected")
        return cmd.Result(argv, 0, out + "\n", "")


class Rule:
    """Class 2 clashes with class 2; everything else is compatible."""

    def compatible(self, a, b, gpu_type=None):
        return not (a == 2 and b == 2)


def test_a_refresh_is_three_slurm_calls_whatever_the_cluster_size(monkeypatch):
    shares = {str(100 + i): (f"n{i % 50}", i % 3) for i in range(400)}
    fake = FakeSlurm(100, shares)
    monkeypatch.setattr(cmd, "run", fake.run)
    view = clusterview.SlurmClusterView(CONFIG)
    assert view.refresh()
    # Nodes, running jobs (with their tags), reservations: whatever the number of shares.
    assert [c[0] for c in fake.calls] == ["sinfo", "squeue", "scontrol"]
    assert "admin_comment:0" in fake.calls[1][-1]
    nodes = {n.name: n for n in view.nodes()}
    assert len(nodes) == 100
    assert sorted(nodes["n0"].resident_classes) == sorted(
        cls for node, cls in shares.values() if node == "n0")
    assert nodes["n0"].gpus == 4 and nodes["n1"].gpu_type == "a100"
    fake.calls.clear()
    del shares["100"]
    assert view.refresh() and len(fake.calls) == 3
    nodes = {n.name: n for n in view.nodes()}
    assert len(nodes["n0"].resident_classes) == sum(node == "n0" for node, _c in shares.values())


def test_exclusions_are_memoised_per_snapshot(monkeypatch):
    # n0 holds 4 class-2 shares on its 4 GPUs: a class-2 job must not land there.
    shares = {str(100 + i): ("n0", 2) for i in range(4)}
    fake = FakeSlurm(10, shares)
    monkeypatch.setattr(cmd, "run", fake.run)
    view = clusterview.SlurmClusterView(CONFIG)
    view.refresh()
    fits = [g for g in CONFIG.gpu_types if g.name == "v100"]
    asked = []

    class Counting(Rule):
        def compatible(self, a, b, gpu_type=None):
            asked.append((a, b))
            return super().compatible(a, b, gpu_type)

    rule = Counting()
    assert incompatible_nodes(2, fits, ["gpu"], view, rule) == (["n0"], 5)
    first = len(asked)
    assert incompatible_nodes(2, fits, ["gpu"], view, rule) == (["n0"], 5)
    assert len(asked) == first  # answered from the snapshot's memo
    assert incompatible_nodes(2, fits, ["gpu"], view, Rule()) == (["n0"], 5)  # another KB
    assert incompatible_nodes(2, fits, ["gpu"], view, rule) == (["n0"], 5)
    assert len(asked) > first  # asked again: the memo held the other KB's answer
    del shares["100"]
    view.refresh()  # a new snapshot: n0 has a clean GPU again
    asked.clear()  # answered by the refresh already (it re-asks what the old snapshot was asked)
    assert incompatible_nodes(2, fits, ["gpu"], view, rule) == ([], 5)
    assert asked == []


def test_decisions_read_whole_snapshots_during_a_refresh(monkeypatch):
    shares = {str(100 + i): (f"n{i % 200}", 2) for i in range(3000)}
    fake = FakeSlurm(400, shares)
    monkeypatch.setattr(cmd, "run", fake.run)
    view = clusterview.SlurmClusterView(CONFIG)
    view.refresh()
    stop, seen = threading.Event(), set()

    def refresher():
        while not stop.is_set():
            view.refresh()

    thread = threading.Thread(target=refresher)
    thread.start()
    try:
        for _ in range(2000):
            seen.add(len(view.nodes()))
    finally:
        stop.set()
        thread.join()
    assert seen == {400}
