"""The knowledge base (ISD/PS per class pair) and Gavel's telemetry proxy."""

from __future__ import annotations

import pandas as pd
import pytest

from slurm_gpushare.predict import datasets, knowledge
from slurm_gpushare.predict.classes import default_classes
from slurm_gpushare.predict.evaluate import evaluate_kb_on_alnair
from slurm_gpushare.predict.knowledge import (KnowledgeBase, class_of_history, measured_isd,
                                              packing_saving)
from slurm_gpushare.daemon.store import Store


def test_formulas_reproduce_a_published_row():
    # Table III: Inceptionv3 (alone 316.2 s) with SmallBERT L2 (alone 253.9 s)
    assert measured_isd(338.8, 316.2) == pytest.approx(0.0715, abs=5e-4)
    assert measured_isd(294.5, 253.9) == pytest.approx(0.1599, abs=5e-4)
    assert packing_saving(338.8, 294.5, 316.2, 253.9) == pytest.approx(0.405, abs=1e-3)  # 40.5%
    with pytest.raises(ValueError):
        measured_isd(10, 0)


def test_seeded_base_counts_and_orientation():
    kb = KnowledgeBase.seeded()  # the paper's cluster ids
    assert kb.classes() == [0, 1, 2]
    assert sum(r["count"] for r in kb.table()) == 34
    ab, ba = kb.pair(0, 2, "p100"), kb.pair(2, 0, "p100")
    assert ab.source == "gpu" and (ab.isd_a, ab.isd_b) == (ba.isd_b, ba.isd_a)
    assert kb.pair(0, 2, "v100").source == "class-pair"  # unknown type: any GPU
    unknown = kb.pair(0, 9)
    assert unknown.source == "prior" and unknown.count == 0 and unknown.spread > 0
    # class 0 with class 0 includes Inceptionv3 + ResNet-50 (62-66% slowdown): too risky
    assert not kb.compatible(0, 0)
    assert kb.compatible(0, 1)


@pytest.mark.parametrize("paper_classes", [False, True])
def test_the_packaged_seed_seeds_what_the_alnair_tables_say(paper_classes):
    """The daemon seeds from ``kb-seed.json`` (no pandas); seeding from the alnair tables
    themselves, each side classed by ``predict`` on its telemetry, gives the same base."""
    classes = None if paper_classes else default_classes()
    from_tables = KnowledgeBase(classes_digest="paper" if paper_classes else classes.digest())
    for row in knowledge.alnair_pairs(classes).itertuples(index=False):
        from_tables.observe(row.class_a, row.class_b, row.isd_a, row.isd_b, ps=row.ps,
                            gpu_type=knowledge.ALNAIR_GPU, prior=True)
    assert len(knowledge.seed_pairs()) == 34
    assert KnowledgeBase.seeded(classes).to_dict() == from_tables.to_dict()


def test_online_observations_change_the_verdict():
    kb = KnowledgeBase.seeded(default_classes())
    assert kb.compatible(0, 1, "a100")
    for _ in range(5):
        kb.observe(1, 0, isd_a=0.9, isd_b=0.1, gpu_type="a100")
    stats = kb.pair(0, 1, "a100")
    assert stats.source == "gpu" and stats.count == 5
    assert stats.isd_a == pytest.approx(0.1) and stats.isd_b == pytest.approx(0.9)
    assert not kb.compatible(0, 1, "a100")
    assert kb.compatible(0, 1, "p100")  # the seed's GPU keeps its own evidence


def test_save_load_and_from_store(tmp_path):
    classes = default_classes()
    kb = KnowledgeBase.seeded(classes)
    kb.observe(2, 2, 0.5, 0.6, ps=0.1, gpu_type="v100")
    kb.save(tmp_path / "kb.json")
    again = KnowledgeBase.load(tmp_path / "kb.json")
    assert again.table("v100") == kb.table("v100")
    assert again.classes_digest == classes.digest()
    with Store(tmp_path / "s.db") as store:
        store.record_corun("1", "2", class_a=2, class_b=2, isd_a=0.5, isd_b=0.6, ps=0.1,
                           gpu_type="v100")
        store.record_corun("3", "4")  # not measured yet: ignored
        learned = KnowledgeBase.from_store(store, classes)
    assert learned.table("v100") == kb.table("v100")


def test_class_of_history_uses_the_most_specific_runs():
    classes = default_classes()
    history = [
        {"matched_key": 0, "mgup_max": 92.0, "mgmap_max_pct": 55.0, "mgtsamp_max": 55.0},
        {"matched_key": 2, "mgup_max": 3.0, "mgmap_max_pct": 3.0, "mgtsamp_max": 0.0},
    ]
    job_class, detail = class_of_history(classes, history)
    assert job_class == classes.predict_one(92, 55, 55) and "exact script" in detail
    assert class_of_history(classes, history[1:])[0] == classes.predict_one(3, 3, 0)
    assert class_of_history(classes, [{"mgup_max": None}])[0] is None


def test_gavel_proxy_uses_no_pair_measurement(monkeypatch):
    profiles = knowledge.gavel_profiles()
    util = profiles.set_index(["gpu", "job"])["gpu_util_pct"]
    assert util[("v100", "ResNet-50 (batch size 64)")] > 50
    assert util[("v100", "Recommendation (batch size 1024)")] < 10
    assert profiles["mem_util_pct"].isna().all()  # not derivable: left unknown, not invented
    pairs = datasets.load_gavel_pairs()
    scrambled = pairs.assign(norm_a=pairs["norm_a"].sample(frac=1, random_state=0).to_numpy(),
                             norm_b=0.5)
    monkeypatch.setattr(datasets, "load_gavel_pairs", lambda: scrambled)
    pd.testing.assert_frame_equal(knowledge.gavel_profiles(), profiles)


def test_class_lookup_held_out_on_the_alnair_pairs():
    figures = evaluate_kb_on_alnair(None)
    assert (figures["pairs"], figures["sides"]) == (34, 68)
    assert figures["held_out"] == "leave-one-pair-out"
    assert figures["recommended_below_threshold"] <= figures["recommended_pairs"] <= 34
    assert -1 <= figures["spearman"] <= 1
