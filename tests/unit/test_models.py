"""`slurm-gpushare models fit`: the memory predictor refit from the site's own history."""

from __future__ import annotations

import json

from conftest import make_config
from slurm_gpushare.cli import main
from slurm_gpushare.predict.persist import load_memory_model, model_path, site_observations
from slurm_gpushare.daemon.store import Store


def _key(name: str) -> str:
    return (name.encode().hex() * 64)[:64]  # fingerprint keys are 64 hex digits


def _job(store, job_id, key, model, peak, pct=40.0):
    store.record_decision({"decision_id": f"d{job_id}", "action": "share", "code": "x",
                           "reason": "", "keys": [_key(key), _key("user")], "ts": 1.0})
    store.ingest_summary({"v": 1, "cluster": "", "job_id": job_id, "gpu_index": 0,
                          "gpu_model": model, "mgmap_max_mib": peak, "mgmap_max_pct": pct,
                          "samples": 3, "coruns": [], "conditions": [], "keys": []})
    store.link_decision(f"d{job_id}", job_id, "")


def test_site_observations_use_the_exact_key_and_skip_preallocation(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        _job(store, "1", "k1", "Tesla V100-SXM2-16GB", 9000.0)
        _job(store, "2", "k1", "NVIDIA A100-SXM4-80GB", 9800.0)
        _job(store, "3", "k2", "Tesla V100-SXM2-16GB", 15500.0, pct=97.0)  # grabbed it all
        frame = site_observations(store)
    assert sorted(frame.gpu) == ["A100-80GB", "V100-16GB"]
    assert set(frame.job) == {f"site:{_key('k1')}"}


def test_models_fit_writes_a_model_the_daemon_loads(tmp_path, capsys):
    config = make_config(tmp_path)
    config_file = tmp_path / "gpushare.toml"
    config_file.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                           f'secret_file = "{tmp_path / "secret"}"\n')
    with Store(tmp_path / "state" / "store.sqlite") as store:
        for i in range(3):
            _job(store, f"{i}0", f"k{i}", "Tesla V100-SXM2-16GB", 5000.0 + 1000 * i)
            _job(store, f"{i}1", f"k{i}", "NVIDIA A100-SXM4-80GB", 5600.0 + 1000 * i)
    assert main(["models", "fit", "--config", str(config_file), "--json"]) == 0
    metadata = json.loads(capsys.readouterr().out)
    assert metadata["metrics"]["site_jobs"] == 3 and metadata["metrics"]["site_rows"] == 6
    assert model_path(config).name == "memory.json" and model_path(config).exists()
    assert load_memory_model(config) is not None
    assert main(["models", "show", "--config", str(config_file)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["path"] == str(model_path(config)) and shown["metrics"] == metadata["metrics"]


def test_models_fit_without_a_store_is_a_clear_error(tmp_path, capsys):
    config_file = tmp_path / "gpushare.toml"
    config_file.write_text(f'[daemon]\nstate_dir = "{tmp_path / "none"}"\n')
    assert main(["models", "fit", "--config", str(config_file)]) == 1
    assert "no store at" in capsys.readouterr().err
