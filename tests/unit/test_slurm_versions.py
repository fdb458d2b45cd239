"""What differs between Slurm 22.05 and 24.11, read from both versions' real outputs
(``tests/data/sacct/`` holds 22.05's, ``tests/data/sacct/24.11/`` 24.11's; see record.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpushare.slurm.jobs import gres_placements
from slurm_gpushare.slurm.version import SlurmVersion

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"


def test_versions_as_slurm_prints_them():
    assert SlurmVersion.parse("slurm-wlm 22.05.8") == SlurmVersion(22, 5, 8)
    assert SlurmVersion.parse("slurm 24.11.5") == SlurmVersion(24, 11, 5)
    assert SlurmVersion.parse("24.11.5-4") == SlurmVersion(24, 11, 5)
    assert SlurmVersion.parse("no version here") is None
    assert str(SlurmVersion(22, 5, 8)) == "22.05.8"
    assert SlurmVersion(22, 5, 8).tres_prefix == "gres:"
    assert SlurmVersion(24, 11, 5).tres_prefix == "gres/"
    assert SlurmVersion(23, 11, 4).gpu_whole_and_shard_bug
    assert not SlurmVersion(23, 11, 5).gpu_whole_and_shard_bug
    assert SlurmVersion(23, 2).accounts_gpu_usage and not SlurmVersion(22, 5, 8).accounts_gpu_usage


def test_gres_lines_of_both_versions():
    # 22.05 (recorded): indices; 24.11 (recorded on the 24.11 test cluster): used/total per GPU.
    assert gres_placements((DATA / "scontrol_show_job_d.txt").read_text())[0] == ("a100-2", [0])
    text = ("     Nodes=a100-1 CPU_IDs=0 Mem=0 GRES=gpu:a100:2(IDX:0-1)\n"
            "     Nodes=t4-1 CPU_IDs=0 Mem=0 GRES=mps:50(50/100,0/100)\n"
            "     Nodes=a100-2 CPU_IDs=0 Mem=0 GRES=shard:20(0/80,20/80)\n"
            "     Nodes=v100-1 CPU_IDs=0 Mem=0 GRES=\n")
    assert gres_placements(text) == [("a100-1", [0, 1]), ("t4-1", [0]), ("a100-2", [1])]


@pytest.mark.skipif(not (DATA / "24.11" / "scontrol_show_job_d.txt").exists(),
                    reason="24.11 recordings not there")
def test_recorded_24_11_gres_lines():
    places = gres_placements((DATA / "24.11" / "scontrol_show_job_d.txt").read_text())
    # A first run on a whole GPU (any node), a 6-shard share on v100-1, an MPS share on t4-1.
    assert len(places) == 3 and [node for node, _ in places[1:]] == ["v100-1", "t4-1"]
    assert all(len(indices) == 1 for _, indices in places)


def _summary(records):
    return sorted((r.job_id, r.state, r.exit_code, r.signal, tuple(sorted(r.alloc_tres.items())),
                   r.tag, len(r.steps)) for r in records)


def test_sacct_psv_and_json_agree_on_24_11():
    # (22.05's v0.0.38 JSON reports exit codes differently from its -P output; see
    # test_accounting.py for what is read from it.)
    from slurm_gpushare.slurm.accounting import parse_sacct

    folder = DATA / "24.11"
    psv = parse_sacct((folder / "awkward.psv").read_text())
    as_json = parse_sacct((folder / "awkward.json").read_text())
    assert len(psv) >= 15 and _summary(psv) == _summary(as_json)
    killed = [r for r in psv if r.signal == 9]
    assert killed and all(r.state == "FAILED" for r in killed)
