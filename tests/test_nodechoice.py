import math

from slurm_gpushare.predict.nodechoice import TypeQueue, choose_types

CAP = {"v100": 16 * 1024, "a100": 80 * 1024, "t4": 15 * 1024}


def test_queueing_delay_is_eq1():
    queue = TypeQueue(gpus=4, running_remaining_s=[100, 300], pending_estimated_s=[400])
    assert queue.delay_s() == 200
    assert TypeQueue(gpus=0).delay_s() == math.inf


def test_ranks_fitting_types_by_estimated_jct():
    choice = choose_types(
        safe_mib={"v100": 10_000, "a100": 11_000, "t4": 10_500},
        runtime_s={"v100": 1000, "a100": 500, "t4": 3000},
        queues={"v100": TypeQueue(2), "a100": TypeQueue(1, running_remaining_s=[2000]),
                "t4": TypeQueue(1)},
        capacity_mib=CAP)
    # a100: 2000 + 500; v100: 0 + 1000; t4: 0 + 3000
    assert choice.types == ("v100", "a100", "t4")
    assert choice.best.jct_s == 1000
    assert choice.ranked[1].delay_s == 2000


def test_excludes_types_where_the_safe_estimate_does_not_fit():
    choice = choose_types(safe_mib={"v100": 20_000, "a100": 21_000}, runtime_s={},
                          queues={t: TypeQueue(1) for t in CAP}, capacity_mib=CAP)
    assert choice.types == ("a100",)
    assert "needs 19.5 GiB" in choice.excluded["v100"]
    assert choice.excluded["t4"] == "no memory estimate for this type"


def test_user_type_is_a_hard_constraint():
    choice = choose_types(safe_mib={"v100": 9000, "a100": 9000},
                          runtime_s={"v100": 10, "a100": 1},
                          queues={t: TypeQueue(1) for t in CAP}, capacity_mib=CAP,
                          requested_type="v100")
    assert choice.types == ("v100",)
    assert "asks for v100" in choice.excluded["a100"]
    nothing = choose_types(safe_mib={"v100": 90_000}, runtime_s={}, queues={},
                           capacity_mib=CAP, requested_type="v100")
    assert nothing.types == () and "needs" in nothing.excluded["v100"]


def test_unknown_runtime_ranks_last_and_jct_ratio_prunes():
    queues = {t: TypeQueue(1) for t in CAP}
    choice = choose_types(safe_mib={t: 1000 for t in CAP}, runtime_s={"v100": 100, "a100": 50},
                          queues=queues, capacity_mib=CAP)
    assert choice.types == ("a100", "v100", "t4")
    assert choice.ranked[-1].runtime_s is None
    pruned = choose_types(safe_mib={t: 1000 for t in CAP}, runtime_s={"v100": 100, "a100": 50},
                          queues=queues, capacity_mib=CAP, max_jct_ratio=1.5)
    assert pruned.types == ("a100",)
    assert "over 1.5x" in pruned.excluded["v100"]
