"""A small, fast subset of the fault and attack suite (``bench/attacks.py``) on the real
cluster: a user provoking refusals, protocol fuzz, a bad reload. (kill -9 during ingest
restarts the daemon, which takes tens of seconds on a loaded 2-core runner: it runs in the
bench, not here; its parts are covered by tests/unit/test_durable.py and test_hardening.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import attacks  # noqa: E402


def test_a_user_provoking_refusals_cannot_switch_sharing_off_for_others(cluster):
    result = attacks.provoke_errors(cluster, jobs=6)
    assert result["attacker_submissions"] >= 2
    assert (result["rejected"], result["half_applied"]) == (0, 0)
    assert result["rewritten"] == result["accepted"] == 6


def test_fuzzed_requests_get_replies_with_rid_and_leave_no_traceback(cluster):
    result = attacks.protocol_fuzz(cluster, requests=500, seed=7)
    assert result["answered"] == 500 and result["replies_without_rid"] == 0
    assert result["tracebacks"] == 0 and result["rss_change_pct"] < 10


def test_a_reload_with_a_misspelt_feature_is_refused_and_jobs_still_share(cluster):
    result = attacks.bad_reload(cluster, jobs=4)
    assert result["reload_refused"]
    assert (result["rejected"], result["half_applied"], result["rewritten"]) == (0, 0, 4)
