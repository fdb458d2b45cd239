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


class ChurningSlurm(FakeSlurm):
    """A cluster whose shares, node states and reservation change between refreshes."""

    def __init__(self, nodes, shares):
        super().__init__(nodes, shares)
        self.states = {f"n{i}": "mix" for i in range(nodes)}
        self.reserved = "n2,n3"

    def run(self, argv, **kwargs):
        argv = tuple(argv)
        if argv[0] == "sinfo":
            self.calls.append(argv)
            out = "\n".join(f"n{i}|{'a100' if i % 2 else 'v100'},ib{i % 3}|"
                            f"{'gpu*' if i % 4 else 'debug'}|gpu:4|{self.states[f'n{i}']}"
                            for i in range(self.nodes))
            return cmd.Result(argv, 0, out + "\n", "")
        if argv[0] == "scontrol":
            self.calls.append(argv)
            return cmd.Result(argv, 0, f"ReservationName=maint Nodes={self.reserved}\n", "")
        return super().run(argv, **kwargs)


SHARE_WHEN_IDLE = parse_config({"policy": {"sharing_partitions": ["gpu", "debug"],
                                          "keep_whole_when_idle": False},
                               "gpu_types": {"v100": {"memory_gib": 16, "feature": "v100"},
                                             "a100": {"memory_gib": 80, "feature": "a100"}}})


def _decisions(view, requests, estimates, knowledge):
    from slurm_gpushare.core.policy import decide
    from slurm_gpushare.daemon.validity import decision_problem
    out = []
    for config in (CONFIG, SHARE_WHEN_IDLE):
        for request in requests:
            for estimate in estimates:
                decision = decide(request, config, estimate=estimate, view=view,
                                  knowledge=knowledge, decision_id="d")
                out.append((decision.action, decision.code, dict(decision.writes),
                            decision_problem(decision, request, config, view.nodes())))
    return out


def test_a_refresh_pre_answers_what_decisions_asked_with_the_same_answers(monkeypatch):
    from slurm_gpushare.core.policy import JobEstimate
    from slurm_gpushare.core.types import JobRequest
    shares = {str(100 + i): (f"n{i % 16}", i % 3) for i in range(72)}  # 4-5 a node: none idle
    fake = ChurningSlurm(16, shares)
    monkeypatch.setattr(cmd, "run", fake.run)
    config = CONFIG
    view = clusterview.SlurmClusterView(config)
    view.refresh()
    base = dict(uid=1000, partition="gpu", tres_per_node="gres:gpu:1")
    requests = [JobRequest(**base), JobRequest(**{**base, "partition": "gpu,debug"}),
                JobRequest(**base, features="ib1"), JobRequest(**base, features="ib0|ib2"),
                JobRequest(**base, exc_nodes="n[1-5]"), JobRequest(**base, req_nodes="n6"),
                JobRequest(**base, reservation="maint"), JobRequest(**base, features="ib7"),
                JobRequest(**base, array_tasks=4)]
    estimates = [JobEstimate(source="history", memory_mib={"v100": 9000, "a100": 9000},
                             job_class=c, detail="test") for c in (0, 1, 2)]
    estimates.append(JobEstimate(source="history", memory_mib={"a100": 30000}, job_class=2,
                                 detail="test"))
    knowledge = Rule()
    first = _decisions(view, requests, estimates, knowledge)
    asked = set(view.nodes().checks) | set(view.nodes().memo)
    assert any(k[0] == "feasibility" for k in asked) and any(k[0] == "idle" for k in asked)
    assert any(k[0] == "partition-features" for k in asked)
    assert any(k[0] == "gpus" for k in asked)  # an array's tasks as shares against whole

    # Shares end and start, nodes drain and come back, the reservation moves, GPUs go idle.
    for step in range(4):
        for job in list(shares)[: 10 + 4 * step]:
            del shares[job]
        for i in range(8):
            shares[f"{500 + 10 * step + i}"] = (f"n{(i * 5 + step) % 16}", (i + step) % 3)
        fake.states[f"n{step + 1}"] = "drain" if step % 2 == 0 else "idle"
        fake.states[f"n{8 + step}"] = "down*"
        fake.reserved = f"n{step + 4},n{step + 5}"
        view.refresh()
        warmed = view.nodes()
        # Pre-answered before any decision on this snapshot: every question asked before.
        assert set(dict.keys(warmed.checks)) == {k for k in asked if isinstance(k[0], str)}
        assert set(dict.keys(warmed.memo)) == {k for k in asked if not isinstance(k[0], str)}
        assert not warmed.checks.asked and not warmed.memo.asked
        cold = clusterview._Fixed(clusterview.Snapshot(list(warmed)), view.reservations())
        with_warming = _decisions(view, requests, estimates, knowledge)
        without = _decisions(cold, requests, estimates, knowledge)
        assert with_warming == without
        assert with_warming != first or step == 0  # the changes reached the decisions
        asked |= set(view.nodes().checks) | set(view.nodes().memo)
    assert {d[1] for d in with_warming} >= {"history-share", "no-valid-type"}


def test_pre_answered_questions_expire(monkeypatch):
    from slurm_gpushare.core.policy import idle_gpus_by_type
    fake = ChurningSlurm(6, {})
    monkeypatch.setattr(cmd, "run", fake.run)
    monkeypatch.setattr(clusterview, "WARM_REFRESHES", 3)
    view = clusterview.SlurmClusterView(CONFIG)
    view.refresh()
    assert list(idle_gpus_by_type(list(CONFIG.gpu_types), ["gpu"], view)) == ["v100", "a100"]
    for _ in range(3):
        view.refresh()
        assert ("idle", ("v100", "a100"), ("gpu",)) in dict.keys(view.nodes().checks)
    view.refresh()  # not asked for three refreshes: no longer pre-answered
    assert not dict.keys(view.nodes().checks)


def test_claiming_idle_gpus_keeps_the_answers_it_does_not_change(monkeypatch):
    from slurm_gpushare.core.policy import idle_gpus_by_type
    fake = ChurningSlurm(2, {})  # n0: v100, 4 idle GPUs; n1: a100
    monkeypatch.setattr(cmd, "run", fake.run)
    view = clusterview.SlurmClusterView(CONFIG)
    view.refresh()
    v100, a100 = CONFIG.gpu_types
    assert idle_gpus_by_type([v100], ["gpu", "debug"], view) == {"v100": 4}
    a100_idle = {n.name: n.idle_gpus for n in view.nodes()}["n1"]
    assert idle_gpus_by_type([a100], ["gpu", "debug"], view) == {"a100": a100_idle}
    both = idle_gpus_by_type([v100, a100], ["gpu", "debug"], view)
    for left in (3, 1):
        view.claim_idle(["v100"], 1 if left == 3 else 2)  # one job, then an array of two
        # The v100 counts carry over with the claimed GPUs taken off (no pass over every node
        # on the submit path); the a100 answer carries over as it was.
        checks = view.nodes().checks
        assert dict(checks[("idle", ("v100",), ("gpu", "debug"))]) == {"v100": left}
        assert dict(checks[("idle", ("v100", "a100"), ("gpu", "debug"))]) == {
            "v100": left, "a100": both["a100"]}
        assert ("idle", ("a100",), ("gpu", "debug")) in dict.keys(checks)
        assert {n.name: n.idle_gpus for n in view.nodes()}["n0"] == left
        # What a fresh pass over the same nodes says.
        fresh = clusterview._Fixed(clusterview.Snapshot(list(view.nodes())), {})
        assert idle_gpus_by_type([v100], ["gpu", "debug"], fresh) == {"v100": left}
    view.claim_idle(["v100"], 5)  # more than are idle: all of them, no further
    assert {n.name: n.idle_gpus for n in view.nodes()} == {"n0": 0, "n1": a100_idle}
    assert idle_gpus_by_type([v100], ["gpu", "debug"], view) == {}
    before = view.nodes()
    view.claim_idle(["v100"])  # nothing idle left of that type: the snapshot stays
    assert view.nodes() is before


def test_health_says_how_many_nodes_take_jobs_and_when_the_view_was_read(monkeypatch):
    """What `ping` reports (an admin's check, and what the test cluster waits for after its
    slurmd register): nodes not responding or drained count as not usable."""
    fake = FakeSlurm(4, {})
    states = {"n0": "idle", "n1": "idle*", "n2": "drain", "n3": "mix"}
    real_run = fake.run

    def run(argv, **kwargs):
        result = real_run(argv, **kwargs)
        if argv[0] != "sinfo":
            return result
        lines = [f"{line}|{states[line.split('|')[0]]}" for line in result.stdout.split()]
        return cmd.Result(result.argv, 0, "\n".join(lines) + "\n", "")

    monkeypatch.setattr(cmd, "run", run)
    view = clusterview.SlurmClusterView(CONFIG)
    assert view.health() == {"nodes": 0, "usable": 0, "refreshed_at": None}
    assert view.refresh()
    health = view.health()
    assert (health["nodes"], health["usable"]) == (4, 2)
    first = health["refreshed_at"]
    states["n1"] = "idle"
    assert view.refresh()
    assert view.health()["usable"] == 3 and view.health()["refreshed_at"] >= first
