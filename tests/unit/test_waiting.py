"""Exclusions of pending shares lifted once their reason has gone (daemon/exclusions.py); end to
end on the real cluster in tests/cluster/test_cluster_history.py."""

from __future__ import annotations

from slurm_gpushare.core.config import parse_config
from slurm_gpushare.core.policy import NodeView
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.daemon import exclusions
from slurm_gpushare.daemon.exclusions import (Exclusion, ExclusionWatch, exc_node_list,
                                              parse_pending, still_blocked)
from slurm_gpushare.slurm import cmd

CONFIG = parse_config({"policy": {"sharing_partitions": ["gpu"]},
                       "gpu_types": {"v100": {"memory_gib": 16, "feature": "v100"}}})
V100 = CONFIG.gpu_type("v100")
TAG = Tag("share", "history-share", "d1", shard=4, types=("v100",)).encode()


class Avoids:
    """Pair judgement: the job should not join the share ``bad`` (or any of ``bad``)."""

    def __init__(self, *bad: str):
        self.bad = set(bad)

    def compatible_with(self, resident, gpu_type=None):
        return resident not in self.bad

    def compatible_with_group(self, residents, gpu_type=None):
        return not self.bad & set(residents)


class View:
    def __init__(self, *nodes: NodeView):
        self._nodes = list(nodes)

    def nodes(self):
        return self._nodes


def node(name: str, free: tuple[int, ...], jobs: tuple[tuple[str, ...], ...]) -> NodeView:
    return NodeView(name=name, gpu_type="v100", partitions=("gpu",), gpus=len(free),
                    free_units=free, gpu_jobs=jobs,
                    resident_jobs=tuple(j for gpu in jobs for j in gpu))


def entry(away=("n1",), blockers=None, knowledge=None, user="") -> Exclusion:
    return Exclusion("d1", TAG, user, tuple(away),
                     blockers=blockers if blockers is not None else {"n1": frozenset({"busy"})},
                     fits=(V100,), partitions=("gpu",), units=4, job_class=None,
                     knowledge=knowledge or Avoids("busy", "newcomer"))


def test_the_users_own_list_is_kept_as_written_before_the_daemons_nodes():
    assert exc_node_list("", ["n1", "n2"]) == "n1,n2"
    assert exc_node_list("n[3-4]", ["n1"]) == "n[3-4],n1"
    assert exc_node_list("n[3-4]", []) == "n[3-4]"
    assert exc_node_list("", []) == ""


def test_pending_jobs_are_found_by_their_decision_id():
    out = "\n".join([f"17|{TAG}", "18|(null)", f"19_[2-5]|{TAG}",
                     "20|" + Tag("share", "x", "d2", shard=2).encode(), "21|not a tag", ""])
    assert parse_pending(out) == {"d1": ["17", "19_[2-5]"], "d2": ["20"]}


def test_a_node_stays_excluded_while_a_share_that_caused_it_is_there():
    view = View(node("n1", (12, 16), (("busy",), ())))
    assert still_blocked(entry(), view) == ("n1",)


def test_a_node_is_released_once_its_blockers_are_gone():
    view = View(node("n1", (16, 16), ((), ())))
    assert still_blocked(entry(), view) == ()


def test_a_blocker_still_there_keeps_the_node_even_without_room_now():
    # No room now means the check made now would not keep the job off (it could not land
    # there); the partner that caused the exclusion is still there, so it stays.
    view = View(node("n1", (0, 0), (("busy", "other"), ("third",))))
    assert still_blocked(entry(), view) == ("n1",)


def test_a_newer_partner_it_should_not_join_keeps_the_node():
    view = View(node("n1", (12, 16), (("newcomer",), ())))
    assert still_blocked(entry(), view) == ("n1",)


def test_a_node_the_view_no_longer_shows_stays_excluded():
    assert still_blocked(entry(), View(node("n2", (16,), ((),)))) == ("n1",)


def updates_recorded(monkeypatch, squeue_out: str, ok: bool = True):
    calls = []

    def run(argv, **_kwargs):
        calls.append(list(argv))
        if argv[0] == "squeue":
            return cmd.Result(tuple(argv), 0, squeue_out, "")
        return cmd.Result(tuple(argv), 0 if ok else 1, "", "" if ok else "Job is no longer pending")
    monkeypatch.setattr(cmd, "run", run)
    return calls


LATER = 1e9  # a review long after every decision (monotonic seconds)


def test_review_updates_pending_jobs_and_keeps_the_rest(monkeypatch):
    calls = updates_recorded(monkeypatch, f"17|{TAG}\n")
    watch = ExclusionWatch()
    watch.add(entry(away=("n1", "n2"), user="n9",
                    blockers={"n1": frozenset({"busy"}), "n2": frozenset({"busy2"})}))
    view = View(node("n1", (16, 16), ((), ())), node("n2", (12, 16), (("busy2",), ())))
    done = watch.review(view, now=LATER)
    assert calls[0][0] == "squeue" and "PD" in calls[0]
    assert calls[1] == ["scontrol", "update", "JobId=17", "ExcNodeList=n9,n2",
                        f"AdminComment={TAG}"]
    assert done == [{"id": "d1", "job_id": "17", "lifted": ["n1"], "still": ["n2"]}]
    assert len(watch) == 1
    # Nothing to lift since: Slurm is not asked.
    assert watch.review(view, now=LATER) == [] and len(calls) == 2
    # The second node frees: its exclusion goes too, and so does the entry.
    watch.review(View(node("n1", (16, 16), ((), ())), node("n2", (16, 16), ((), ()))),
                 now=LATER)
    assert calls[-1][3] == "ExcNodeList=n9" and len(watch) == 0


def test_every_pending_part_of_an_array_is_updated(monkeypatch):
    calls = updates_recorded(monkeypatch, f"19_[2-5]|{TAG}\n20_1|{TAG}\n")
    watch = ExclusionWatch()
    watch.add(entry())
    watch.review(View(node("n1", (16, 16), ((), ()))), now=LATER)
    assert [c[2] for c in calls[1:]] == ["JobId=19_[2-5]", "JobId=20_1"]


def test_a_refused_update_is_not_retried_for_the_same_nodes(monkeypatch):
    calls = updates_recorded(monkeypatch, f"17|{TAG}\n", ok=False)
    watch = ExclusionWatch()
    watch.add(entry())
    done = watch.review(View(node("n1", (16, 16), ((), ()))), now=LATER)
    assert done[0]["error"] == "Job is no longer pending"
    assert len(watch) == 0
    watch.review(View(node("n1", (16, 16), ((), ()))), now=LATER)
    assert [c[0] for c in calls] == ["squeue", "scontrol"]


def test_slurm_is_asked_only_when_something_can_be_lifted(monkeypatch):
    calls = updates_recorded(monkeypatch, "")
    assert ExclusionWatch().review(View(), now=LATER) == []
    watch = ExclusionWatch()
    watch.add(entry())
    watch.review(View(node("n1", (12, 16), (("busy",), ()))), now=LATER)  # still blocked
    assert calls == []


def test_a_decision_just_made_is_not_looked_for_yet(monkeypatch):
    calls = updates_recorded(monkeypatch, "")
    watch = ExclusionWatch()
    watch.add(entry())
    free = View(node("n1", (16, 16), ((), ())))
    decided = watch._entries["d1"].decided_at
    watch.review(free, now=decided + exclusions.SETTLE_S / 2)
    assert calls == [] and len(watch) == 1
    # Later, a job not pending (started, ended, cancelled) is forgotten.
    watch.review(free, now=decided + exclusions.SETTLE_S)
    assert [c[0] for c in calls] == ["squeue"] and len(watch) == 0


def test_memory_stays_bounded(monkeypatch):
    monkeypatch.setattr(exclusions, "MAX_ENTRIES", 3)
    watch = ExclusionWatch()
    for i in range(5):
        e = entry()
        e.decision_id = f"d{i}"
        watch.add(e)
    assert sorted(watch._entries) == ["d2", "d3", "d4"]
