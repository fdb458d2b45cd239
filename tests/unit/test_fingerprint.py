"""Fingerprints: keyed digests, script normalisation, and that no secret text is ever kept."""

from __future__ import annotations

import os
import stat

import pytest

from slurm_gpushare.daemon import fingerprint
from slurm_gpushare.node import agent
from slurm_gpushare.daemon.fingerprint import (Fingerprinter, SecretError, load_or_create_secret,
                                        normalise_script)
from slurm_gpushare.daemon.store import Store

SCRIPT = """#!/bin/bash
#SBATCH --job-name=run1
#SBATCH --gres=gpu:1
#SBATCH --output=logs/run1.out
#SBATCH --time=01:00:00

# train the model
module load cuda
python train.py --epochs 10
"""

EDITED = """#!/bin/bash
#SBATCH --job-name=run2-retry
#SBATCH    --gres=gpu:1
#SBATCH -o logs/run2.out
#SBATCH --time=01:00:00
#SBATCH --comment=second try


# a different comment
module load   cuda
python train.py --epochs 10
"""


@pytest.fixture
def fp(tmp_path):
    return Fingerprinter.from_file(tmp_path / "etc" / "secret")


def test_secret_created_0600_and_reused(tmp_path):
    path = tmp_path / "etc" / "secret"
    first = load_or_create_secret(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) == 32
    assert load_or_create_secret(path) == first


def test_secret_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(os.urandom(32))
    path.chmod(0o644)
    with pytest.raises(SecretError, match="0600"):
        load_or_create_secret(path)


def test_normalisation_keeps_the_key_across_cosmetic_edits(fp):
    assert normalise_script(SCRIPT) == normalise_script(EDITED)
    assert fp.job_keys("alice", SCRIPT, "run1").exact == fp.job_keys("alice", EDITED, "x").exact


def test_real_changes_change_the_exact_key(fp):
    base = fp.job_keys("alice", SCRIPT).exact
    assert fp.job_keys("alice", SCRIPT.replace("--epochs 10", "--epochs 20")).exact != base
    assert fp.job_keys("alice", SCRIPT.replace("gpu:1", "gpu:2")).exact != base
    assert fp.job_keys("bob", SCRIPT).exact != base


def test_fallback_keys_and_order(fp):
    keys = fp.job_keys("alice", SCRIPT, "run1")
    assert keys.as_list() == [keys.exact, keys.name, keys.user]
    assert len(set(keys.as_list())) == 3
    other = fp.job_keys("alice", "python other.py", "run1")
    assert other.name == keys.name and other.user == keys.user and other.exact != keys.exact
    assert fp.job_keys("alice").as_list() == [keys.user]


def test_keys_from_digests_match_keys_from_text(fp):
    keys = fp.job_keys("alice", SCRIPT, "run1")
    assert fp.keys_from_digests("alice", fp.digest("script", SCRIPT),
                                fp.digest("name", "run1")) == keys


def test_digests_depend_on_the_secret(tmp_path):
    one = Fingerprinter.from_file(tmp_path / "a")
    two = Fingerprinter.from_file(tmp_path / "b")
    assert one.digest("script", SCRIPT) != two.digest("script", SCRIPT)
    # length-prefixed parts: moving a character between user and digest changes the key
    assert one.keys_from_digests("ab", "c").exact != one.keys_from_digests("a", "bc").exact


SECRETS = ["TopSecretModelZeta", "lr=0.000371", "/data/private/cohort-7731", "alice_private_run"]


def test_nothing_secret_reaches_store_spool_or_logs(tmp_path, fp):
    script = (f"#!/bin/bash\n#SBATCH --job-name={SECRETS[3]}\npython train.py "
              f"--model {SECRETS[0]} --{SECRETS[1]} --data {SECRETS[2]}\n")
    keys = fp.job_keys("alice", script, SECRETS[3])
    state = tmp_path / "state"
    store = Store(state / "gpushare.db")
    store.record_decision({"decision_id": "d1", "action": "share", "code": "history-share",
                           "reason": "peak 9.1 GiB on v100 + 10% margin", "share_gib": 10,
                           "gpu_types": ["v100"], "keys": keys.as_list()})
    assert store.link_decision("d1", "101")
    summary = {"v": 1, "cluster": "c1", "job_id": "101", "gpu_index": 0, "gpu_model": "Tesla V100",
               "mgup_max": 80.0, "mgmap_max_pct": 50.0, "mgtsamp_max": 30.0, "end_ts": 1.0,
               "keys": keys.as_list(),
               # fields a careless caller might add: the store must drop them
               "script": script, "job_name": SECRETS[3], "comment": SECRETS[0]}
    assert store.ingest_summary(summary)
    assert store.history(keys.as_list())[0]["job_id"] == "101"
    # the agent's path: daemon unreachable -> spooled; and its log
    deliver = agent.default_deliver(str(state / "no-daemon.sock"), agent.spool_dir(state))
    clean = {k: v for k, v in summary.items() if k not in ("script", "job_name", "comment")}
    assert deliver(clean | {"job_id": "102"}) == "spooled"
    args = agent.build_parser().parse_args(["stop", "--job-id", "102", "--state-dir", str(state)])
    agent.stop(args)
    store.close()

    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.suffix == ".json" for p in files) and any(p.name == "agent.log" for p in files)
    assert any(p.name.endswith(".db") for p in files)
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            for encoding in ("utf-8", "utf-16-le"):
                assert secret.encode(encoding) not in data, f"{secret!r} found in {path.name}"


def test_digests_never_change_with_the_implementation():
    """Stored history is found by these digests: the one-shot HMAC must equal the streamed one
    that made the digests already in stores."""
    import hashlib
    import hmac

    from slurm_gpushare.daemon.fingerprint import Fingerprinter

    def streamed(secret, domain, *parts):
        mac = hmac.new(secret, domain.encode(), hashlib.sha256)
        for part in parts:
            data = part.encode("utf-8", "surrogatepass")
            mac.update(len(data).to_bytes(8, "big"))
            mac.update(data)
        return mac.hexdigest()

    # Secrets shorter than, as long as and longer than SHA-256's block (a longer key is hashed).
    for secret in (b"s" * 32, bytes(range(64)), b"\xff" * 100, b"0123456789abcdef"):
        fingerprinter = Fingerprinter(secret)
        for args in (("key:exact", "alice", "ab" * 32), ("script", "#!/bin/sh\nü\n"),
                     ("key:user", ""), ("script", "x" * 70000)):
            assert fingerprinter._mac(*args) == streamed(secret, *args)


def test_keys_from_digests_remembers_answers_and_they_are_the_computed_ones():
    fp = Fingerprinter(b"k" * 32)
    other = Fingerprinter(b"j" * 32)
    question = ("alice", "a" * 64, "b" * 64, "c" * 64)
    first = fp.keys_from_digests(*question)
    assert fp.keys_from_digests(*question) is first  # the second time from the memo
    assert first == fp._keys_from_digests(*question)
    assert other.keys_from_digests(*question) != first  # per secret (a reload makes a new one)
    assert fp.keys_from_digests("bob", *question[1:]) != first
    for n in range(fingerprint.KEYS_REMEMBERED + 10):  # bounded
        fp.keys_from_digests(f"user{n}", "a" * 64)
    assert len(fp._keys) <= fingerprint.KEYS_REMEMBERED
