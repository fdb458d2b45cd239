"""The prolog and epilog shell scripts as Slurm runs them (/bin/sh, root, a bare environment):
whatever the agent env file holds, they exit 0, since Slurm drains a node whose prolog or
epilog fails, and requeues its job."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

BROKEN_ENV_FILES = {
    "unterminated quote": 'GPUSHARE_STATE_DIR="/tmp/x\n',
    "syntax error": "if then fi (\n",
    "unset required variable": "X=${FOO:?}\n",
    "readonly then assigned": "readonly GPUSHARE_STATE_DIR\nGPUSHARE_STATE_DIR=/tmp\n",
    "exit with a status": "exit 3\n",
    "set -e and a failing command": "set -e\nfalse\n",
}


def run(script: str, env_file: Path, tmp_path: Path) -> tuple[int, list[str]]:
    """Run ``script`` with a stub python that records how the agent was called."""
    calls = tmp_path / "calls"
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    stub.chmod(0o755)
    env_file.write_text(env_file.read_text() + f"GPUSHARE_PYTHON={stub}\n"
                        if env_file.exists() else f"GPUSHARE_PYTHON={stub}\n")
    done = subprocess.run(["/bin/sh", str(SCRIPTS / script)], timeout=30, capture_output=True,
                          env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7",
                               "GPUSHARE_AGENT_ENV": str(env_file)})
    return done.returncode, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("script, command", [("prolog.sh", "start"), ("epilog.sh", "stop")])
def test_a_good_env_file_runs_the_agent(tmp_path, script, command):
    assert run(script, tmp_path / "agent.env", tmp_path) == (
        0, [f"-m slurm_gpushare.node.agent {command}"])


@pytest.mark.parametrize("script", ["prolog.sh", "epilog.sh"])
@pytest.mark.parametrize("content", BROKEN_ENV_FILES.values(), ids=BROKEN_ENV_FILES.keys())
def test_a_broken_env_file_never_fails_the_job(tmp_path, script, content):
    env_file = tmp_path / "agent.env"
    env_file.write_text(content)
    status, _calls = run(script, env_file, tmp_path)
    assert status == 0
