"""The admin guide's backup and restore (docs/admin-guide.md, "Back up, upgrade, move"): an
online backup of the store taken while the daemon answers and records, restored beside its
secret, gives a daemon that decides a job from its history as the original did; restored with
another secret, it knows no job."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import RunningDaemon, make_config, run_once
from slurm_gpushare.daemon.protocol import request as request_once
from slurm_gpushare.daemon.server import STORE_FILE

JOB = {"uid": 1000, "user": "alice", "partition": "gpu", "tres_per_node": "gres:gpu:1",
       "min_nodes": 4294967294, "shared": 65534, "batch": True,
       "script": "#!/bin/sh\n#SBATCH --gres=gpu:1\npython train.py --epochs 3\n"}


def decide(daemon) -> dict:
    return request_once(daemon.socket, {"v": 1, "op": "decide", "job": JOB})["decision"]


def given(decision: dict) -> tuple:
    """What a decision gives the job (its decision id aside)."""
    return (decision["code"], decision["writes"].get("tres_per_node"),
            decision["writes"].get("features"))


def restored(root: Path, store: Path, secret: Path | None) -> RunningDaemon:
    """A daemon whose state directory holds ``store`` (and whose secret is ``secret``, or a
    new one when None), as the guide's restore puts them back."""
    config = make_config(root)
    state = Path(config.daemon.state_dir)
    state.mkdir(parents=True)
    shutil.copy2(store, state / STORE_FILE)
    if secret is not None:
        shutil.copy2(secret, config.daemon.secret_file)
    return RunningDaemon(config)


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="sqlite3 (scripts/install-deps.sh)")
def test_an_online_backup_restores_the_history_only_with_its_secret(tmp_path):
    original = RunningDaemon(make_config(tmp_path / "original"))
    backup = tmp_path / "backup" / "gpushare-store.sqlite"
    backup.parent.mkdir()
    try:
        first = run_once(original, JOB, "NVIDIA A100-SXM4-80GB", 81920.0)
        assert first["code"] != "history-share"
        before = decide(original)
        assert before["code"] == "history-share", before
        original.service.records.flush()
        # The daemon is up, its connections open and its last writes in the WAL file.
        store = Path(original.config.daemon.state_dir) / STORE_FILE
        assert Path(f"{store}-wal").stat().st_size > 0
        subprocess.run(["sqlite3", str(store), f".backup {backup}"], check=True, timeout=60)
        secret = tmp_path / "backup" / "gpushare-secret"
        shutil.copy2(original.config.daemon.secret_file, secret)
        assert given(decide(original)) == given(before)  # the backup disturbed nothing
    finally:
        original.stop()

    again = restored(tmp_path / "restored", backup, secret)
    try:
        assert given(decide(again)) == given(before)
    finally:
        again.stop()

    stranger = restored(tmp_path / "another-secret", backup, None)
    try:
        assert decide(stranger)["code"] == first["code"]  # a first run again
    finally:
        stranger.stop()
