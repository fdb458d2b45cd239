"""Waiting shares follow the cluster (the rule in core/waiting.py, applied by daemon/waiting.py):
exclusions lifted once their reason has gone, added where the share would now land next to a
partner it should not join, slower types added while the offered ones stay full. End to end on the real cluster in tests/cluster/test_cluster_history.py; in the simulator
in tests/unit/test_sim_engine.py."""

from __future__ import annotations

from slurm_gpushare.core.config import parse_config
from slurm_gpushare.core.policy import NodeView
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.daemon import waiting
from slurm_gpushare.core.waiting import (WaitingShare, exc_node_list, newly_blocked,
                                        review_one, still_blocked, types_to_add)
from slurm_gpushare.daemon.waiting import WaitingShares, parse_pending
from slurm_gpushare.slurm import cmd

CONFIG = parse_config({"policy": {"sharing_partitions": ["gpu"]},
                       "gpu_types": {"v100": {"memory_gib": 16, "feature": "v100"},
                                     "a100": {"memory_gib": 80, "feature": "a100"}}})
V100, A100 = CONFIG.gpu_type("v100"), CONFIG.gpu_type("a100")
TAG = Tag("share", "history-share", "d1", shard=4, types=("v100",)).encode()
LATER = 1e9  # a review long after every decision (monotonic seconds)


class Avoids:
    """Pair judgement: the job should not join the shares in ``bad``."""

    def __init__(self, *bad: str):
        self.bad = set(bad)

    def compatible_with(self, resident, gpu_type=None):
        return resident not in self.bad

    def compatible_with_group(self, residents, gpu_type=None):
        return not self.bad & set(residents)


class View:
    def __init__(self, *nodes: NodeView, running=()):
        self._nodes = list(nodes)
        self.running_decisions = frozenset(running)

    def nodes(self):
        return self._nodes

    def node(self, name: str) -> NodeView | None:
        return next((n for n in self._nodes if n.name == name), None)


def node(name: str, free: tuple[int, ...], jobs: tuple[tuple[str, ...], ...] = (),
         gpu_type: str = "v100") -> NodeView:
    jobs = jobs or tuple(() for _ in free)
    return NodeView(name=name, gpu_type=gpu_type, partitions=("gpu",), gpus=len(free),
                    free_units=free, gpu_jobs=jobs,
                    resident_jobs=tuple(j for gpu in jobs for j in gpu))


def entry(away=("n1",), blockers=None, user="", types=(V100,), later=(), features="v100",
          tag=TAG, array=False, knowledge=None, required="") -> WaitingShare:
    return WaitingShare("d1", tag, features, tuple(types), tuple(later), user, tuple(away),
                        blockers=blockers if blockers is not None else {"n1": frozenset({"busy"})},
                        partitions=("gpu",), units=4, job_class=None,
                        knowledge=knowledge or Avoids("busy", "newcomer"), array=array,
                        user_req_nodes=required)


# -- exclusions -----------------------------------------------------------------------------
def test_the_users_own_list_is_kept_as_written_before_the_daemons_nodes():
    assert exc_node_list("", ["n1", "n2"]) == "n1,n2"
    assert exc_node_list("n[3-4]", ["n1"]) == "n[3-4],n1"
    assert exc_node_list("n[3-4]", []) == "n[3-4]"
    assert exc_node_list("", []) == ""


def test_pending_jobs_are_found_by_their_decision_id():
    out = "\n".join([f"17|{TAG}", "18|(null)", f"19_[2-5]|{TAG}",
                     "20|" + Tag("share", "x", "d2", shard=2).encode(), "21|not a tag", ""])
    d2 = Tag("share", "x", "d2", shard=2).encode()
    assert parse_pending(out) == {"d1": [("17", TAG), ("19_[2-5]", TAG)], "d2": [("20", d2)]}


def test_a_node_stays_excluded_while_a_share_that_caused_it_is_there():
    assert still_blocked(entry(), View(node("n1", (12, 16), (("busy",), ()))).node) == ("n1",)


def test_a_node_is_released_once_its_blockers_are_gone():
    assert still_blocked(entry(), View(node("n1", (16, 16))).node) == ()


def test_a_blocker_still_there_keeps_the_node_even_without_room_now():
    # No room now means the check made now would not keep the job off (it could not land
    # there); the partner that caused the exclusion is still there, so it stays.
    view = View(node("n1", (0, 0), (("busy", "other"), ("third",))))
    assert still_blocked(entry(), view.node) == ("n1",)


def test_a_newer_partner_it_should_not_join_keeps_the_node():
    assert still_blocked(entry(), View(node("n1", (12, 16), (("newcomer",), ()))).node) == ("n1",)


def test_a_node_the_view_no_longer_shows_stays_excluded():
    assert still_blocked(entry(), View(node("n2", (16,))).node) == ("n1",)


def test_only_the_nodes_named_as_changed_are_judged_again():
    # The simulator names the nodes whose allocations changed since its last review; the
    # others keep their verdict, even where the view now would lift them.
    share = entry(away=("n1", "n2"), blockers={"n1": frozenset({"busy"}),
                                               "n2": frozenset({"busy"})})
    view = View(node("n1", (16, 16)), node("n2", (16, 16)))
    assert still_blocked(share, view.node) == ()
    assert still_blocked(share, view.node, judged=["n2"]) == ("n1",)
    assert still_blocked(share, view.node, judged=[]) is share.away  # nothing to rebuild


class Counted(Avoids):
    """Pair judgement that counts how often it is asked."""

    def __init__(self, *bad: str):
        super().__init__(*bad)
        self.asked = 0

    def compatible_with(self, resident, gpu_type=None):
        self.asked += 1
        return super().compatible_with(resident, gpu_type)

    def compatible_with_group(self, residents, gpu_type=None):
        self.asked += 1
        return super().compatible_with_group(residents, gpu_type)


def test_entries_judged_alike_share_answers_within_one_review():
    knowledge = Counted("newcomer")
    view = View(NodeView("n1", "v100", ("gpu",), gpus=1, resident_jobs=("newcomer", "other")))
    first, second = (WaitingShare(d, TAG, "v100", (V100,), (), "", ("n1",), blockers={},
                                  partitions=("gpu",), units=4, job_class=None,
                                  knowledge=knowledge) for d in ("d1", "d2"))
    memo: dict = {}
    assert still_blocked(first, view.node, memo=memo) == ("n1",)
    asked = knowledge.asked
    assert still_blocked(second, view.node, memo=memo) == ("n1",)
    assert knowledge.asked == asked  # the same judge on the same node: answered once
    # Another judge (another job's pair predictor) is asked itself.
    other = WaitingShare("d3", TAG, "v100", (V100,), (), "", ("n1",), blockers={},
                         partitions=("gpu",), units=4, job_class=None, knowledge=Counted())
    assert still_blocked(other, view.node, memo=memo) == ()


def test_a_node_where_it_would_now_land_next_to_a_bad_partner_is_newly_blocked():
    share = entry(away=())
    landing_bad = node("n1", (12, 16), (("busy",), ()))  # lands on GPU 0, next to "busy"
    landing_free = node("n2", (16, 12), ((), ("busy",)))  # lands on the idle GPU 0
    full_beside = node("n3", (0, 16), (("busy",), ()))  # GPU 0 full: it lands on GPU 1
    no_room = node("n4", (2, 2), (("busy",), ("busy",)))  # cannot land there now
    assert newly_blocked(share, [landing_bad, landing_free, full_beside, no_room]) == {
        "n1": frozenset({"busy"})}


def test_only_nodes_it_could_use_are_newly_blocked():
    bad = (("busy",), ())
    share = entry(away=(), user="n[2-3]", required="n4")
    nodes = [node("n1", (12, 16), bad), node("n2", (12, 16), bad), node("n4", (12, 16), bad),
             node("a1", (12, 80), bad, gpu_type="a100"),
             NodeView("n5", "v100", ("other",), gpus=2, free_units=(12, 16), gpu_jobs=bad,
                      resident_jobs=("busy",))]
    # Not n2 (excluded by the job itself), n4 (named by it: Slurm refuses a job whose
    # --nodelist node is excluded), a1 (not its type) or n5 (not its partition).
    assert list(newly_blocked(share, nodes)) == ["n1"]


def test_its_own_claim_is_no_partner():
    # Until it runs, the view counts a decided share where it will go (its decision id).
    share = entry(away=())
    assert newly_blocked(share, [node("n1", (12, 16), (("d1",), ()))]) == {}


def test_exclusions_are_added_only_while_a_node_it_could_use_stays_open():
    share = entry(away=())
    bad = [node("n1", (12, 16), (("busy",), ())), node("n2", (12, 16), (("newcomer",), ()))]
    view = View(*bad)
    change = review_one(share, view, view.node, new_from=bad, could_use=3)
    assert change.still == ("n1", "n2") and dict(change.blocked) == {
        "n1": frozenset({"busy"}), "n2": frozenset({"newcomer"})}
    assert review_one(share, view, view.node, new_from=bad, could_use=2) is None


# -- types ----------------------------------------------------------------------------------
def test_a_slower_type_is_added_only_while_the_offered_ones_are_full():
    share = entry(away=(), types=(A100,), later=(V100,), features="a100")
    full_a100 = node("a1", (0, 0), gpu_type="a100")
    assert types_to_add(share, View(full_a100, node("v1", (16, 16))), ()) == (V100,)
    # Room on a100 again, or none on v100: nothing to add.
    assert types_to_add(share, View(node("a1", (0, 80), gpu_type="a100"),
                                    node("v1", (16, 16))), ()) == ()
    assert types_to_add(share, View(full_a100, node("v1", (2, 0))), ()) == ()
    # A view that does not know free room says nothing.
    assert types_to_add(share, View(NodeView("a1", "a100", ("gpu",)), node("v1", (16,))),
                        ()) == ()


def recorded(monkeypatch, squeue_out: str, ok: bool = True):
    calls = []

    def run(argv, **_kwargs):
        calls.append(list(argv))
        if argv[0] == "squeue":
            return cmd.Result(tuple(argv), 0, squeue_out, "")
        return cmd.Result(tuple(argv), 0 if ok else 1, "", "" if ok else "Job is no longer pending")
    monkeypatch.setattr(cmd, "run", run)
    return calls


def test_a_waiting_share_is_widened_with_its_constraint_and_tag(monkeypatch):
    tag = Tag("share", "history-share", "d1", shard=4, types=("a100",)).encode()
    calls = recorded(monkeypatch, f"17|{tag}\n")
    watch = WaitingShares()
    watch.add(entry(away=(), types=(A100,), later=(V100,), features="bigmem&a100", tag=tag))
    done = watch.review(View(node("a1", (0, 0), gpu_type="a100"), node("v1", (16, 16))),
                        now=LATER)
    widened = Tag("share", "history-share", "d1", shard=4, types=("a100", "v100")).encode()
    assert calls[1] == ["scontrol", "update", "JobId=17", "Features=bigmem&(a100|v100)",
                        f"AdminComment={widened}"]
    assert done == [{"id": "d1", "added_types": ["v100"], "types": ["a100", "v100"],
                     "job_id": "17"}]
    assert len(watch) == 1  # still judged for nodes to keep it off while it waits


def test_a_constraint_changed_since_is_not_guessed_at(monkeypatch):
    calls = recorded(monkeypatch, f"17|{TAG}\n")
    watch = WaitingShares()
    watch.add(entry(away=(), types=(A100,), later=(V100,), features="something-else"))
    assert watch.review(View(node("a1", (0, 0), gpu_type="a100"), node("v1", (16, 16))),
                        now=LATER) == []
    assert [c[0] for c in calls] == ["squeue"] and watch._entries["d1"].later == ()


# -- reviews --------------------------------------------------------------------------------
def test_review_lifts_what_has_gone_and_keeps_the_rest(monkeypatch):
    calls = recorded(monkeypatch, f"17|{TAG}\n")
    watch = WaitingShares()
    watch.add(entry(away=("n1", "n2"), user="n9",
                    blockers={"n1": frozenset({"busy"}), "n2": frozenset({"busy2"})}))
    view = View(node("n1", (16, 16)), node("n2", (12, 16), (("busy2",), ())))
    done = watch.review(view, now=LATER)
    assert calls[0][0] == "squeue" and "PD" in calls[0]
    assert calls[1] == ["scontrol", "update", "JobId=17", "ExcNodeList=n9,n2",
                        f"AdminComment={TAG}"]
    assert done == [{"id": "d1", "lifted": ["n1"], "still": ["n2"], "job_id": "17"}]
    assert len(watch) == 1
    # Nothing to lift since: Slurm is not asked.
    assert watch.review(view, now=LATER) == [] and len(calls) == 2
    # The second node frees: its exclusion goes too, and so does the entry.
    watch.review(View(node("n1", (16, 16)), node("n2", (16, 16))), now=LATER)
    assert calls[-1][3] == "ExcNodeList=n9"
    assert watch._entries["d1"].away == ()  # judged on while it waits


def test_every_pending_part_of_an_array_is_updated(monkeypatch):
    calls = recorded(monkeypatch, f"19_[2-5]|{TAG}\n20_1|{TAG}\n")
    watch = WaitingShares()
    watch.add(entry(array=True))
    # Some of its tasks run: the others still wait.
    watch.review(View(node("n1", (16, 16)), running={"d1"}), now=LATER)
    assert [c[2] for c in calls[1:]] == ["JobId=19_[2-5]", "JobId=20_1"]


def test_a_job_whose_tag_changed_since_is_left_alone(monkeypatch):
    # A requeue of an array task that outgrew its share narrowed its types and rewrote its
    # tag: widening it from what the daemon knew before would undo that.
    narrowed = Tag("share", "requeue-resized", "d1", shard=9, types=("a100",)).encode()
    tag = Tag("share", "history-share", "d1", shard=4, types=("a100",)).encode()
    calls = recorded(monkeypatch, f"19_[2-5]|{tag}\n19_1|{narrowed}\n")
    watch = WaitingShares()
    watch.add(entry(away=(), types=(A100,), later=(V100,), features="a100", tag=tag,
                    array=True))
    watch.review(View(node("a1", (0, 0), gpu_type="a100"), node("v1", (16, 16))), now=LATER)
    assert [c[2] for c in calls[1:]] == ["JobId=19_[2-5]"]


def test_blockers_are_read_off_the_view_the_decision_saw_at_the_first_review(monkeypatch):
    # The decision only hands over its snapshot (no loop over the nodes on the submit path).
    calls = recorded(monkeypatch, f"17|{TAG}\n")
    watch = WaitingShares()
    share = entry()
    share.blockers, share.seen_on = None, View(node("n1", (12, 16), (("busy",), ()))).nodes()
    watch.add(share)
    watch.review(View(node("n1", (12, 16), (("busy",), ()))), now=LATER)
    assert share.blockers == {"n1": frozenset({"busy"})} and share.seen_on is None
    assert calls == []  # still blocked by the same share
    watch.review(View(node("n1", (16, 16))), now=LATER)
    assert calls[-1][3] == "ExcNodeList="


def test_a_share_seen_running_is_forgotten_without_asking_slurm(monkeypatch):
    calls = recorded(monkeypatch, "")
    watch = WaitingShares()
    watch.add(entry())
    watch.review(View(node("n1", (16, 16)), running={"d1"}), now=LATER)
    assert calls == [] and len(watch) == 0


def test_a_refused_update_is_not_retried(monkeypatch):
    calls = recorded(monkeypatch, f"17|{TAG}\n", ok=False)
    watch = WaitingShares()
    watch.add(entry())
    done = watch.review(View(node("n1", (16, 16))), now=LATER)
    assert done[0]["error"] == "Job is no longer pending"
    watch.review(View(node("n1", (16, 16))), now=LATER)
    assert [c[0] for c in calls] == ["squeue", "scontrol"]


def test_slurm_is_asked_only_when_something_would_change(monkeypatch):
    calls = recorded(monkeypatch, "")
    assert WaitingShares().review(View(), now=LATER) == []
    watch = WaitingShares()
    watch.add(entry())
    unjudged = entry(away=(), later=())
    unjudged.knowledge = None  # no class, no profile: nothing could keep it off a node
    watch.add(unjudged)  # nothing it could change: not kept
    assert len(watch) == 1
    watch.review(View(node("n1", (12, 16), (("busy",), ()))), now=LATER)  # still blocked
    assert calls == []


def test_a_decision_just_made_is_not_looked_for_yet(monkeypatch):
    calls = recorded(monkeypatch, "")
    watch = WaitingShares()
    watch.add(entry())
    free = View(node("n1", (16, 16)))
    decided = watch._entries["d1"].decided_at
    watch.review(free, now=decided + waiting.SETTLE_S / 2)
    assert calls == [] and len(watch) == 1
    # Later, a job not pending (started, ended, cancelled) is forgotten.
    watch.review(free, now=decided + waiting.SETTLE_S)
    assert [c[0] for c in calls] == ["squeue"] and len(watch) == 0


def test_review_excludes_a_node_once_a_partner_it_should_not_join_lands_there(monkeypatch):
    calls = recorded(monkeypatch, f"17|{TAG}\n")
    watch = WaitingShares()
    watch.add(entry(away=(), user="n9"))
    quiet = View(node("n1", (16, 16)), node("n2", (16, 16)))
    assert watch.review(quiet, now=LATER) == [] and calls == [] and len(watch) == 1
    # The busy share starts on n1's first GPU, where the job would land.
    busy = View(node("n1", (12, 16), (("busy",), ())), node("n2", (16, 16)))
    done = watch.review(busy, now=LATER)
    assert calls[-1] == ["scontrol", "update", "JobId=17", "ExcNodeList=n9,n1",
                         f"AdminComment={TAG}"]
    assert done == [{"id": "d1", "lifted": [], "still": ["n1"], "excluded": ["n1"],
                     "job_id": "17"}]
    # Once it has gone, the node comes off the list again.
    watch.review(quiet, now=LATER)
    assert calls[-1][3] == "ExcNodeList=n9" and len(watch) == 1


def test_a_node_that_did_not_change_is_not_judged_again(monkeypatch):
    recorded(monkeypatch, "")
    knowledge = Counted("busy")
    watch = WaitingShares()
    watch.add(entry(away=(), knowledge=knowledge))
    view = View(node("n1", (12, 16), (("other",), ())), node("n2", (16, 16)))
    watch.review(view, now=LATER)
    asked = knowledge.asked
    assert asked > 0
    watch.review(view, now=LATER)  # the same node views: nothing to judge
    assert knowledge.asked == asked


def test_first_scans_are_bounded_per_pass(monkeypatch):
    recorded(monkeypatch, "")
    monkeypatch.setattr(waiting, "SCANS_PER_PASS", 2)
    watch = WaitingShares()
    for i in range(5):
        e = entry(away=())
        e.decision_id = f"d{i}"
        watch.add(e)
    view = View(node("n1", (16, 16)))
    watch.review(view, now=LATER)
    assert [e.scanned for e in watch._entries.values()] == [True, True, False, False, False]
    watch.review(view, now=LATER)
    assert sum(e.scanned for e in watch._entries.values()) == 4


def test_memory_stays_bounded(monkeypatch):
    monkeypatch.setattr(waiting, "MAX_ENTRIES", 3)
    watch = WaitingShares()
    for i in range(5):
        e = entry()
        e.decision_id = f"d{i}"
        watch.add(e)
    assert sorted(watch._entries) == ["d2", "d3", "d4"]
