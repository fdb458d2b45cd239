"""The one place that runs Slurm's client commands (scontrol, squeue, sinfo, sacct, sbatch).

Every caller goes through ``run``, so tests replace one function (keyed by argv) and every
command gets the same timeout handling and error wording. Times are asked for as epoch
seconds (``SLURM_TIME_FORMAT=%s``) only where a caller parses them: the variable would
otherwise leak into the environment of jobs the wrapper submits.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from slurm_gpushare.core.errors import UserError


class SlurmError(UserError):
    """A Slurm command is not installed, did not answer in time, or failed."""


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def message(self) -> str:
        """The command's own last words, for one-line errors."""
        lines = (self.stderr or self.stdout).strip().splitlines()
        return lines[-1] if lines else f"{self.argv[0]} exited {self.returncode}"


def run(argv: list[str] | tuple[str, ...], *, timeout: float = 15.0, input: str | None = None,
        epoch_times: bool = False) -> Result:
    """Run one Slurm command to completion. Raises SlurmError if it cannot run or hangs."""
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"} if epoch_times else None
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              input=input, env=env)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: are the Slurm clients installed?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:g}s") from None
    except OSError as exc:
        raise SlurmError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    return Result(tuple(argv), done.returncode, done.stdout, done.stderr)


def output(argv: list[str] | tuple[str, ...], *, timeout: float = 15.0,
           epoch_times: bool = False) -> str | None:
    """stdout of a command that succeeded; None when it failed or could not run (for callers
    that degrade quietly: the daemon's view, telemetry lookups)."""
    try:
        result = run(argv, timeout=timeout, epoch_times=epoch_times)
    except SlurmError:
        return None
    return result.stdout if result.ok else None


def check_output(argv: list[str] | tuple[str, ...], *, timeout: float = 15.0,
                 epoch_times: bool = False) -> str:
    """stdout of a command that must succeed; SlurmError with its message otherwise."""
    result = run(argv, timeout=timeout, epoch_times=epoch_times)
    if not result.ok:
        raise SlurmError(f"{' '.join(argv[:3])} failed: {result.message}")
    return result.stdout


def popen(argv: list[str], *, executable: str | None = None, stdin=None, stdout=None):
    """A Slurm command left running for its caller to stream (the wrapper's sbatch, whose
    output, signals and exit status are relayed as they happen)."""
    return subprocess.Popen(argv, executable=executable, stdin=stdin, stdout=stdout)


PIPE = subprocess.PIPE
