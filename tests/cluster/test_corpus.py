"""The generated corpus (tests/cluster/corpus.py) on the real cluster: >= 150 combinations of
submission form x GPU option x placement x history x shape, none broken."""

from __future__ import annotations

import pytest

from corpus import Corpus, generate, summary

pytestmark = pytest.mark.cluster


def test_generated_corpus_accepted_runnable_and_accounted(cluster):
    cases = generate(150, seed=12)
    assert len(cases) >= 150
    for factor, levels in (("form", 3), ("gpu", 6), ("placement", 7), ("history", 5),
                           ("shape", 3)):
        assert len({getattr(c, factor) for c in cases}) == levels
    Corpus(cluster, seed=12).run(cases, timeout=420)
    table = summary(cases)
    print(table)
    assert table.endswith(f"{len(cases)} accepted, 0 broken"), table
    # The corpus exercises rewrites, keeps and untouched jobs, not only one of them.
    outcomes = {c.outcome for c in cases}
    assert {"share", "kept", "untouched"} <= outcomes, outcomes
