"""Munge-sealed deliveries against a real munged (two realms: the site's key and another)."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from devcluster.munge import start_munged
from slurm_gpushare.slurm import munge

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")


@pytest.fixture(scope="module")
def realms(tmp_path_factory):
    root = tmp_path_factory.mktemp("munge")
    site, foreign = start_munged(root / "site"), start_munged(root / "foreign")
    yield site, foreign
    for name in ("site", "foreign"):
        pid = int((root / name / "munged.pid").read_text())
        os.kill(pid, 15)


MESSAGE = {"v": 1, "op": "ingest", "summary": {"job_id": "42", "gpu_index": 0, "peak": 1.5}}


def test_a_sealed_message_verifies_once(realms):
    site, _ = realms
    sealed = munge.seal(MESSAGE, socket=site)
    credential = munge.verify(sealed, {os.getuid()}, socket=site)
    assert credential.uid == os.getuid() and credential.payload == munge.digest(MESSAGE)
    with pytest.raises(munge.MungeError) as replayed:
        munge.verify(sealed, {os.getuid()}, socket=site)
    assert replayed.value.reason == "cred-replayed"


def test_forged_deliveries_are_refused(realms):
    site, foreign = realms
    cases = {
        "unsealed": dict(MESSAGE),
        "foreign key": munge.seal(MESSAGE, socket=foreign),
        "changed after sealing": {**munge.seal(MESSAGE, socket=site),
                                  "summary": {**MESSAGE["summary"], "peak": 99.0}},
        "garbage": {**MESSAGE, "auth": "MUNGE:not-a-credential"},
        "not a string": {**MESSAGE, "auth": ["MUNGE:"]},
    }
    reasons = {}
    for name, message in cases.items():
        with pytest.raises(munge.MungeError) as refused:
            munge.verify(message, {os.getuid()}, socket=site)
        reasons[name] = refused.value.reason
    assert reasons == {"unsealed": "bad-cred", "foreign key": "cred-invalid",
                       "changed after sealing": "digest-mismatch", "garbage": "bad-cred",
                       "not a string": "bad-cred"}


def test_only_the_prolog_identity_may_deliver(realms):
    site, _ = realms
    with pytest.raises(munge.MungeError) as refused:
        munge.verify(munge.seal(MESSAGE, socket=site), {12345}, socket=site)
    assert refused.value.reason == "uid-refused"


def test_an_expired_credential_is_refused(realms):
    site, _ = realms
    sealed = munge.seal(MESSAGE, socket=site, ttl_s=1)
    time.sleep(2.2)  # the credential's own lifetime: nothing to poll
    with pytest.raises(munge.MungeError) as refused:
        munge.verify(sealed, {os.getuid()}, socket=site)
    assert refused.value.reason == "cred-expired"


def test_munge_not_running_is_a_clear_refusal(tmp_path):
    with pytest.raises(munge.MungeError) as refused:
        munge.encode("x", socket=str(tmp_path / "none.socket"))
    assert refused.value.reason == "munge-failed"
